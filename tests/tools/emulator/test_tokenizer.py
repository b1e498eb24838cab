"""The emulator tokenizer is deterministic, BPE-dense, and independent."""

from __future__ import annotations

import subprocess
import sys

from router.tools.emulator.sampler import OutputSampler
from router.tools.emulator.tokenizer import BOS_ID, VOCAB_SIZE, Tokenizer, render_chat

ENGLISH = (
    "Prefix caching lets an inference engine skip the prefill of tokens it has "
    "already seen. A router that knows which engine holds which prefix can send "
    "each request where its prompt is warm, cutting time to first token, but it "
    "must also avoid herding every request onto one hot engine. "
) * 4


def test_same_ids_across_instances_and_processes() -> None:
    ids = Tokenizer().encode(ENGLISH)
    assert ids == Tokenizer().encode(ENGLISH)
    code = ("from router.tools.emulator.tokenizer import Tokenizer;"
            f"print(Tokenizer().encode({ENGLISH!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == str(ids)


def test_pinned_ids_do_not_drift() -> None:
    """A change here silently invalidates recorded traces: do it on purpose only."""
    ids = Tokenizer().encode("Hello, world! 12345 routers")
    assert ids[0] == BOS_ID
    assert ids == [1, 55510, 42862, 65857, 50762, 48073, 113932, 105369, 8931]


def test_about_four_chars_per_token() -> None:
    ids = Tokenizer().encode(ENGLISH, add_bos=False)
    ratio = len(ENGLISH) / len(ids)
    assert 3.3 < ratio < 4.7, ratio


def test_ids_in_vocab_and_byte_fallback() -> None:
    ids = Tokenizer().encode("naïve 世界 ok")
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    # 世 and 界 are 3 UTF-8 bytes each -> byte tokens, not hashed pieces.
    assert len([i for i in ids if 16 <= i < 16 + 256]) >= 6


def test_prefix_stability_of_chat_template() -> None:
    tok = Tokenizer()
    turn1 = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "What is a KV cache?"}]
    reply = {"role": "assistant", "content": " it stores keys"}
    turn2 = turn1 + [reply, {"role": "user", "content": "And prefix caching?"}]
    a = tok.encode_chat(turn1)
    b = tok.encode_chat(turn2)
    assert a[0] == BOS_ID
    # Everything but the generation prompt of turn 1 is a prefix of turn 2.
    gen_prompt = tok.encode("<|start|>assistant\n", add_bos=False)
    assert b[: len(a) - len(gen_prompt)] == a[: len(a) - len(gen_prompt)]
    assert render_chat(turn1).startswith("<|begin_of_text|><|start|>system\n")


def test_generated_words_retokenize_to_same_ids() -> None:
    tok = Tokenizer()
    sampler = OutputSampler(tok, seed=7)
    key = sampler.request_key([1, 2, 3])
    out = [sampler.token(key, p) for p in range(40)]
    assert tok.encode(sampler.detokenize(out), add_bos=False) == out
    assert out == [OutputSampler(Tokenizer(), 7).token(key, p) for p in range(40)]
    assert out != [sampler.token(sampler.request_key([1, 2, 4]), p) for p in range(40)]


def test_emulator_does_not_import_router_hashing_or_prompt() -> None:
    code = ("import sys, router.tools.emulator.server, router.tools.emulator.engine;"
            "print(sorted(m for m in sys.modules if m in "
            "('router.request.hashing', 'router.request.prompt')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
