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
