"""Engine tokens per router-estimated token: the usage parser and the estimator."""

from __future__ import annotations

import json

from router.engines.token_ratio import MAX_RATIO, MIN_RATIO, PromptCountWindows, TokenRatio, WindowSample, reported_prompt_tokens


def test_the_prompt_count_of_a_json_answer_and_of_a_stream_tail() -> None:
    answer = {"id": "x", "choices": [{"text": "hi"}], "usage": {"prompt_tokens": 1022, "completion_tokens": 8,
                                                                "total_tokens": 1030}}
    assert reported_prompt_tokens(json.dumps(answer).encode()) == 1022
    assert reported_prompt_tokens(json.dumps(answer, separators=(",", ":")).encode()) == 1022
    tail = (b'data: {"choices":[{"delta":{"content":"!"}}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens": 77,"total_tokens":80,"completion_tokens":3}}\n\ndata: [DONE]\n\n')
    assert reported_prompt_tokens(tail) == 77
    # continuous usage in every chunk: the last one counts
    assert reported_prompt_tokens(b'{"usage":{"prompt_tokens":5}}\n{"usage":{"prompt_tokens":6}}') == 6


def test_generated_text_cannot_fake_a_count_and_nonsense_is_ignored() -> None:
    # the model wrote JSON in its answer: inside a JSON string its quotes are escaped
    fake = json.dumps({"choices": [{"text": '{"prompt_tokens": 999999}'}]}).encode()
    assert b'\\"prompt_tokens\\"' in fake
    assert reported_prompt_tokens(fake) is None
    assert reported_prompt_tokens(fake + b',"usage":{"prompt_tokens":12}') == 12
    for data in (b"", b"no usage here", b'{"prompt_tokens": -3}', b'{"prompt_tokens": 0}', b'{"prompt_tokens": "12"}',
                 b'{"prompt_tokens": 1' + b"0" * 20 + b"}", b'{"prompt_tokens": 200000000}', b'x"prompt_tokens": 5',
                 b'{"prompt_tokens" 5}'):
        assert reported_prompt_tokens(data) is None, data


def test_the_ratio_waits_for_enough_answers_then_follows_them_within_bounds() -> None:
    r = TokenRatio(min_requests=4)
    for _ in range(3):
        r.observe(100, 110)
    assert r.ratio == 1.0  # too few answers yet
    r.observe(100, 110)
    assert abs(r.ratio - 1.1) < 1e-9
    r.observe(0, 50)
    r.observe(100, 0)
    r.observe(100, -5)
    assert r.answers == 4  # nothing of those counted
    long = TokenRatio(min_requests=1)
    long.observe(10, 30)
    long.observe(1000, 1000)  # a long prompt weighs by its length
    assert abs(long.ratio - 1030 / 1010) < 1e-3
    assert TokenRatio(min_requests=1, estimated=1.0, reported=1000.0, answers=5).ratio == MAX_RATIO
    assert TokenRatio(min_requests=1, estimated=1000.0, reported=1.0, answers=5).ratio == MIN_RATIO


def test_old_answers_fade() -> None:
    r = TokenRatio(min_requests=1, memory=16)
    for _ in range(200):
        r.observe(100, 200)
    for _ in range(200):
        r.observe(100, 100)  # the engine behind the name changed tokenizer
    assert abs(r.ratio - 1.0) < 0.01


def test_a_window_of_answers_counts_as_many_single_answers() -> None:
    one, many = TokenRatio(min_requests=4, memory=32), TokenRatio(min_requests=4, memory=32)
    for _ in range(3):
        one.observe(100, 300)
    for _ in range(5):
        one.observe(100, 150)
    many.observe(300, 900, 3)
    many.observe(500, 750, 5)
    assert many.answers == one.answers == 8
    assert abs(many.ratio / one.ratio - 1) < 0.03  # decayed as a block, not answer by answer: close, not equal
    absurd = TokenRatio()
    absurd.observe(100, 10**12, 2)
    assert absurd.answers == 0  # a count no two prompts can have is ignored


def windows_with_baseline(**kw: int) -> PromptCountWindows:
    w = PromptCountWindows(**kw)
    assert w.scraped("e", 1_000.0, 10.0) is None  # the baseline: what came before is not ours to count
    return w


def test_a_window_of_answers_without_usage_is_the_engines_count_of_them() -> None:
    w = windows_with_baseline(min_answers=8)
    for _ in range(8):
        w.answered("e", "m", 100, None)  # streams without usage: 100 estimated tokens each
    w.answered("e", "m", 120, 300)  # two answers that reported usage: their tokens are not the others'
    w.answered("e", "m", 120, 300)
    # the engine finished the same ten requests, 8 x 180 + 600 prompt tokens
    assert w.scraped("e", 1_000.0 + 8 * 180 + 600, 20.0) == WindowSample("m", 800, 1440, 8)
    assert w.scraped("e", 3_040.0, 20.0) is None  # a new window, empty


def test_a_window_spans_scrapes_until_it_holds_enough_answers() -> None:
    w = windows_with_baseline(min_answers=4, max_scrapes=3)
    w.answered("e", "m", 100, None)
    assert w.scraped("e", 1_200.0, 11.0) is None  # one answer: not yet
    for _ in range(3):
        w.answered("e", "m", 100, None)
    assert w.scraped("e", 1_800.0, 14.0) == WindowSample("m", 400, 800, 4)
    w.answered("e", "m", 100, None)
    for tokens in (1_900.0, 1_900.0, 1_900.0):  # max_scrapes without filling: starts over
        assert w.scraped("e", tokens, 15.0) is None
    for _ in range(4):
        w.answered("e", "m", 100, None)
    assert w.scraped("e", 2_700.0, 19.0) == WindowSample("m", 400, 800, 4)  # the stale answer is not in it


def test_traffic_the_router_did_not_send_drops_the_window() -> None:
    w = windows_with_baseline(min_answers=4)
    for _ in range(4):
        w.answered("e", "m", 100, None)
    # the engine finished 8 where the router saw 4 end: someone else's requests are in its count
    assert w.scraped("e", 1_000.0 + 8 * 200, 18.0) is None and w.dropped == 1
    # one request ending across the scrape is tolerated
    for _ in range(4):
        w.answered("e", "m", 100, None)
    assert w.scraped("e", 2_600.0 + 5 * 200, 23.0) == WindowSample("m", 400, 1000, 4)


def test_another_model_a_bad_end_or_a_restart_spoil_the_window() -> None:
    w = windows_with_baseline(min_answers=2)
    w.answered("e", "m", 100, None)
    w.answered("e", "other", 100, None)
    assert w.scraped("e", 1_400.0, 12.0) is None and w.dropped == 1
    w.answered("e", "m", 100, None)
    w.spoil("e")  # a request that ended badly: the engine may have counted it
    w.answered("e", "m", 100, None)
    assert w.scraped("e", 1_800.0, 15.0) is None and w.dropped == 2
    w.answered("e", "m", 100, None)
    w.answered("e", "m", 100, None)
    assert w.scraped("e", 50.0, 2.0) is None  # counters went back (a restart): a new baseline, nothing learned
    assert w.scraped("e", None, None) is None and len(w) == 0  # an engine without the counters has no window
    w.answered("e", "m", 100, None)  # no window: nothing kept
    w.retain(set())
    assert len(w) == 0
