"""Engine tokens per router-estimated token: the usage parser and the estimator."""

from __future__ import annotations

import json

from router.engines.token_ratio import MAX_RATIO, MIN_RATIO, TokenRatio, reported_prompt_tokens


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
