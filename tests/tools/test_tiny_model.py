"""The tiny model the real-vLLM tests serve: deterministic files vLLM can load without a download."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from router.tools.tiny_model import write_model


def test_files_are_deterministic_and_complete(tmp_path: Path) -> None:
    a, b = write_model(tmp_path / "a"), write_model(tmp_path / "b")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"] == 64  # CPU kernel needs >= 64
    tok_config = json.loads((a / "tokenizer_config.json").read_text())
    assert "chat_template" in tok_config and tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_tokenizer_round_trips_and_starts_with_bos(tmp_path: Path) -> None:
    model = write_model(tmp_path, vocab_size=1024)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tok.get_vocab_size() <= 1024
    config = json.loads((model / "config.json").read_text())
    assert config["vocab_size"] == tok.get_vocab_size()
    enc = tok.encode("The customer invoice 12345 is late; où est-il?")
    assert enc.ids[0] == config["bos_token_id"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "The customer invoice 12345 is late; où est-il?"
