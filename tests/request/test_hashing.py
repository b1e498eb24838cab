from router.request.hashing import root_seed, text_block_keys, token_block_keys

SEED = root_seed("m")


def test_same_prefix_same_leading_keys():
    a = text_block_keys("x" * 64 + "y" * 64 + "tail-a" * 20, 64, SEED, 100)
    b = text_block_keys("x" * 64 + "y" * 64 + "tail-b" * 20, 64, SEED, 100)
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_changed_character_changes_that_block_and_all_later():
    text = "".join(chr(97 + i % 26) for i in range(640))
    base = text_block_keys(text, 64, SEED, 100)
    changed = text[:200] + "Z" + text[201:]  # inside block 3 (index 3 covers 192..255)
    keys = text_block_keys(changed, 64, SEED, 100)
    assert keys[:3] == base[:3]
    assert all(k != b for k, b in zip(keys[3:], base[3:]))
    assert len(keys) == len(base) == 10


def test_only_full_blocks_and_cap():
    assert text_block_keys("a" * 63, 64, SEED, 100) == []
    assert len(text_block_keys("a" * 640, 64, SEED, 4)) == 4


def test_model_seeds_differ_and_token_keys_differ_from_text():
    assert text_block_keys("a" * 64, 64, root_seed("m1"), 1) != text_block_keys("a" * 64, 64, root_seed("m2"), 1)
    toks = list(range(32))
    k = token_block_keys(toks, 16, SEED, 10)
    assert len(k) == 2 and k == token_block_keys(toks + [7], 16, SEED, 10)
    assert token_block_keys([1] * 16, 16, SEED, 10) != token_block_keys([2] * 16, 16, SEED, 10)


def _reference_chain(data: bytes, size: int, n: int, seed: int) -> list[int]:
    """The chain's definition, one block at a time."""
    import xxhash

    keys, prev = [], seed
    for i in range(n):
        prev = xxhash.xxh3_64_intdigest(data[i * size : (i + 1) * size], seed=prev)
        keys.append(prev)
    return keys


def test_chain_keys_is_the_one_block_at_a_time_chain_at_every_length():
    from router.request.hashing import chain_keys, python_chain_keys

    data = bytes(range(256)) * 300
    for n in (0, 1, 2, 63, 64, 65, 128, 130, 299):
        reference = _reference_chain(data, 256, n, 12345)
        assert chain_keys(data, 256, n, 12345) == reference == python_chain_keys(data, 256, n, 12345), n


def test_token_chain_continues_where_a_shorter_prompt_stopped():
    from router.request.hashing import token_chain

    toks = list(range(1000, 1000 + 16 * 70))
    whole = token_block_keys(toks, 16, SEED, 100)
    head = token_block_keys(toks[: 16 * 40], 16, SEED, 100)
    assert whole[:40] == head
    assert token_chain(toks[16 * 40 :], 16, head[-1], 100) == whole[40:]


def test_non_ascii_text_keys_follow_characters_not_bytes():
    a = text_block_keys("é" * 64 + "x" * 64, 64, SEED, 10)
    b = text_block_keys("é" * 64 + "y" * 64, 64, SEED, 10)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]


def test_ascii_text_keys_whether_the_tail_is_encoded_or_cut_off():
    """text_block_keys encodes the whole text when its unhashed tail is short and cuts the
    prefix off first when it is long: either way the keys are the chain of the leading blocks."""
    from router.request.hashing import _domain_seed, text_block_keys

    text = "".join(chr(97 + (i * 7) % 26) for i in range(64 * 40 + 17))
    start = _domain_seed(SEED, b"t")
    for max_blocks in (40, 21, 20, 19, 3, 1):  # whole (tail <= prefix) down to cut off (tail > prefix)
        want = _reference_chain(text.encode("ascii"), 64, min(40, max_blocks), start)
        assert text_block_keys(text, 64, SEED, max_blocks) == want, max_blocks


def test_the_c_chain_gives_the_bindings_keys_for_any_data_block_size_and_seed():
    import random

    import pytest

    from router.request import hashing

    if hashing._native_chain is None:
        pytest.skip("router.request._chain was not built (no C compiler): hashing.py uses the binding")
    rng = random.Random(7)
    for block in (1, 3, 16, 64, 255, 256, 257, 1024, 4096):  # xxh3's short, mid and long input paths
        for seed in (0, 1, 2**63, 2**64 - 1, rng.getrandbits(64)):
            n = rng.randint(0, 40)
            data = rng.randbytes(n * block + rng.randint(0, block))  # a partial tail block is left alone
            native = hashing._native_chain(data, block, n, seed)
            assert native == hashing.python_chain_keys(data, block, n, seed)
            assert hashing._native_chain(memoryview(data), block, n, seed) == native
            assert all(isinstance(k, int) and 0 <= k < 2**64 for k in native)
    assert hashing._native_chain(b"x" * 64, 16, 0, 5) == [] == hashing._native_chain(b"", 16, -1, 5)
    with pytest.raises(ValueError):
        hashing._native_chain(b"x" * 63, 16, 4, 5)  # fewer blocks than asked for
    with pytest.raises(ValueError):
        hashing._native_chain(b"x" * 64, 0, 4, 5)
    with pytest.raises(OverflowError):
        hashing._native_chain(b"x" * 64, 16, 4, 2**64)  # a seed is a 64-bit key
    with pytest.raises(TypeError):
        hashing._native_chain("text", 16, 1, 5)  # bytes, not str
