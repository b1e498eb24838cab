"""Token mode: request keys over the engine's token blocks, from a local tokenizer.json
(trained here, no download) or from the engine's /tokenize."""

import json

import httpx
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from router.config.model import HashingConfig, load_config
from router.core.instances import InstancePool
from router.request.hashing import root_seed, token_block_keys
from router.request.keys import route_request
from router.request.prompt import parse_body
from router.request.tokenize import EngineTokenizer, FileTokenizer, build_tokenizer
from router.tools.emulator.config import EmulatorConfig
from router.tools.emulator.launch import serve_emulator

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE and a tokenizer_config.json with a chat template."""
    folder = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 50, "parcel tracking and delivery " * 50],
                            trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<s>"}))
    return folder


def file_hashing(folder, **tokens) -> HashingConfig:
    return HashingConfig(mode="tokens", tokens={"source": "file", "path": str(folder / "tokenizer.json"), **tokens})


def parse(body: dict, endpoint="completions"):
    return parse_body(json.dumps(body).encode(), endpoint, 4.0)


async def test_completion_keys_are_chained_over_the_tokenizers_ids(tokenizer_dir):
    hashing = file_hashing(tokenizer_dir)
    tok = FileTokenizer(hashing.tokens)
    prompt = "the quick brown fox jumps over the lazy dog " * 10
    parsed = await tok.apply(parse({"model": "m", "prompt": prompt}))
    ids = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(prompt).ids
    assert parsed.tokens == ids and parsed.prompt_tokens == len(ids)
    req = route_request(parsed, hashing, "r", 16)
    assert req.block_tokens == 16
    assert list(req.keys) == token_block_keys(ids, 16, root_seed("m"), hashing.max_blocks)


async def test_chat_is_rendered_with_the_models_template(tokenizer_dir):
    tok = FileTokenizer(file_hashing(tokenizer_dir).tokens)
    body = {"model": "m", "messages": [{"role": "system", "content": "parcel tracking"}, {"role": "user", "content": "hi"}]}
    parsed = await tok.apply(parse(body, "chat"))
    text = "<s><|system|>parcel tracking<|end|><|user|>hi<|end|><|assistant|>"
    assert parsed.tokens == Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids


async def test_long_prompts_are_encoded_off_the_event_loop_with_the_same_result(tokenizer_dir):
    inline = FileTokenizer(file_hashing(tokenizer_dir, offload_chars=10**9).tokens)
    offloaded = FileTokenizer(file_hashing(tokenizer_dir, offload_chars=10).tokens)
    body = parse({"model": "m", "prompt": "parcel tracking and delivery " * 400})
    assert (await inline.apply(body)).tokens == (await offloaded.apply(body)).tokens


async def test_without_a_template_a_chat_keeps_its_character_keys(tokenizer_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    tok = FileTokenizer(file_hashing(tmp_path).tokens)
    parsed = await tok.apply(parse({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "chat"))
    assert parsed.tokens is None and tok.fallbacks == 1


async def test_the_engine_tokenizes_and_a_missing_engine_falls_back():
    async with serve_emulator(EmulatorConfig(model="m", time_scale=0.01)) as emu:
        config = load_config(overrides={"instances": [{"url": emu.url, "name": "e", "model": "m"}],
                                        "hashing": {"mode": "tokens"}})
        async with httpx.AsyncClient() as client:
            tok = build_tokenizer(config.hashing, InstancePool(config), client)
            assert isinstance(tok, EngineTokenizer)
            body = {"model": "m", "messages": [{"role": "user", "content": "Where is my parcel?"}]}
            parsed = await tok.apply(parse(body, "chat"))
            want = (await client.post(f"{emu.url}/tokenize", json=body)).json()["tokens"]
            assert parsed.tokens == want
            other = await tok.apply(parse({"model": "another", "prompt": "x"}))  # nobody serves it
            assert other.tokens is None and tok.fallbacks == 1


def test_character_mode_has_no_tokenizer():
    config = load_config(overrides={"instances": [{"url": "http://127.0.0.1:1"}]})
    assert build_tokenizer(config.hashing, InstancePool(config), None) is None  # type: ignore[arg-type]
