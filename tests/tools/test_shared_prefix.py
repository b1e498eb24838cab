"""The one shared-prefix generator: seeded, tenant-structured, one emulator token per word."""

from __future__ import annotations

import itertools

import pytest

from router.tools.emulator.tokenizer import Tokenizer
from router.tools.shared_prefix import WORDS, SharedPrefix
from router.tools.workload import SharedPrefixWorkload

SMALL = SharedPrefix(groups=3, users=2, system_tokens=40, question_tokens=8, seed=7)


def test_the_same_fields_give_the_same_prompts_and_orders_and_another_seed_does_not() -> None:
    again = SharedPrefix(groups=3, users=2, system_tokens=40, question_tokens=8, seed=7)
    other = SharedPrefix(groups=3, users=2, system_tokens=40, question_tokens=8, seed=8)
    assert SMALL.texts() == again.texts() and SMALL.texts() != other.texts()
    assert list(itertools.islice(SMALL.picks(), 50)) == list(itertools.islice(again.picks(), 50))
    assert list(itertools.islice(SMALL.picks(), 50)) != list(itertools.islice(other.picks(), 50))
    assert list(itertools.islice(SMALL.rotation(3), 6)) == list(itertools.islice(again.rotation(3), 6))


def test_tenants_share_their_system_prompt_and_nothing_else() -> None:
    texts = SMALL.texts()
    assert len(set(texts.systems)) == 3
    assert len({q for qs in texts.questions for q in qs}) == 6
    a, b = texts.messages((1, 0)), texts.messages((1, 1), note="[9] ")
    assert a[0] == b[0] == {"role": "system", "content": texts.systems[1]}
    assert b[1] == {"role": "user", "content": "[9] " + texts.questions[1][1]}
    prompt = texts.prompt((2, 1))
    assert prompt.startswith(texts.systems[2]) and texts.questions[2][1] in prompt


def test_text_is_one_emulator_token_per_word() -> None:
    assert all(w.isalpha() and len(w) <= 6 for w in WORDS)
    tokenizer = Tokenizer()
    texts = SharedPrefix(groups=2, users=1, system_tokens=500, question_tokens=30, seed=1).texts()
    body = texts.systems[0].split(". ", 1)[1]  # after the "Tenant 0 system prompt." label
    assert len(tokenizer.encode(body, add_bos=False)) == 500
    assert len(tokenizer.encode(texts.questions[1][0].split(": ", 1)[1], add_bos=False)) == 30


def test_blocks_are_fresh_per_segment_and_rounded_up() -> None:
    blocks = SMALL.blocks(16)
    assert [len(s) for s in blocks.systems] == [3, 3, 3]  # 40 tokens -> 3 blocks of 16
    assert all(len(q) == 1 for qs in blocks.questions for q in qs)
    every = [b for s in blocks.systems for b in s] + [b for qs in blocks.questions for q in qs for b in q]
    assert len(every) == len(set(every))
    assert blocks.prompt((1, 1)) == blocks.systems[1] + blocks.questions[1][1]
    with pytest.raises(ValueError):
        SMALL.blocks(0)


def test_picks_cover_every_pair_and_do_not_depend_on_the_content() -> None:
    drawn = list(itertools.islice(SMALL.picks(), 600))
    assert set(drawn) == set(SMALL.pairs())
    SMALL.texts()  # building the text draws from a stream of its own
    assert list(itertools.islice(SMALL.picks(), 600)) == drawn


def test_each_rotation_round_asks_every_pair_once_in_an_order_per_client() -> None:
    first = list(itertools.islice(SMALL.rotation(0), 12))
    assert sorted(first[:6]) == sorted(SMALL.pairs()) and first[6:] == first[:6]
    orders = {tuple(itertools.islice(SMALL.rotation(c), 6)) for c in range(10)}
    assert len(orders) > 1


@pytest.mark.parametrize("field", ["groups", "users", "system_tokens", "question_tokens"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SharedPrefix(**{field: 0})


def test_the_demo_workload_renders_streaming_chat_bodies_sharing_only_system_prompts() -> None:
    workload = SharedPrefixWorkload(groups=3, users=2, system_tokens=50, question_tokens=5, requests=40, seed=2)
    bodies = workload.bodies()
    assert bodies == workload.bodies() and len(bodies) == 40
    assert all(b["stream"] and b["max_tokens"] == workload.max_tokens for b in bodies)
    systems = {b["messages"][0]["content"] for b in bodies}
    assert systems == set(workload.prompts.texts().systems)
    users = [b["messages"][1]["content"] for b in bodies]
    assert len(set(users)) == 40 and users[5].startswith("[5] Question ")
