"""The roofline model's shape: costs move the right way, numbers are sane."""

from __future__ import annotations

import pytest

from router.tools.emulator.perf import (
    LLAMA3_8B_H100,
    LLAMA3_70B_H100X4,
    PROFILES,
    decode_step_time,
    get_profile,
    kv_transfer_time,
    prefill_time,
)


def test_kv_bytes_per_token_from_model_shape() -> None:
    assert LLAMA3_8B_H100.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert LLAMA3_70B_H100X4.kv_bytes_per_token == 80 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_shape(name: str) -> None:
    p = get_profile(name)
    # Prefill grows with new tokens and, per token, with context (attention).
    assert prefill_time(p, 2048, 0) < prefill_time(p, 4096, 0)
    assert prefill_time(p, 1024, 0) < prefill_time(p, 1024, 16384)
    # Decode is memory bound: batching is far cheaper than serial steps.
    one = decode_step_time(p, 1, 2048)
    many = decode_step_time(p, 64, 64 * 2048)
    assert one < many < 8 * one
    assert 0.003 < one < 0.03
    # KV capacity in the hundreds of thousands of tokens.
    assert 100_000 < p.default_cache_tokens < 2_000_000
    assert kv_transfer_time(p, 0) == 0
    assert kv_transfer_time(p, 8192, link_gbps=100) == pytest.approx(
        2 * kv_transfer_time(p, 8192, link_gbps=200))


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ValueError, match="llama3-8b-h100"):
        get_profile("nope")
