"""A tiny llama-shaped model directory that real vLLM serves with ``--load-format dummy``.

Why: the real-engine tests need a model without a download. vLLM initialises random
weights from ``config.json``; what it still needs from disk is a tokenizer, so one is
trained here (byte-level BPE, ``tokenizers`` package) on a deterministic synthetic
corpus, with a ``tokenizer_config.json`` carrying a chat template. The same inputs give
the same files, so tests and CI agree on token counts.

Usage: ``python -m router.tools.tiny_model DIR [--vocab-size N] [--max-model-len N]``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

BOS, EOS = "<s>", "</s>"
# head_dim 64: vLLM's CPU attention kernel rejects smaller heads (head_dim 16 fails).
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 256, 2, 4, 2, 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more can about said up out what "
    "some into them time only could new other than then two may do first any like now my over such our man me "
    "even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three tenant invoice order account policy contract support request "
    "customer service product report system data model router engine cache prefix token block decode prefill"
).split()


def corpus(lines: int = 4000, seed: int = 0) -> Iterator[str]:
    """Deterministic pseudo-English sentences, digits and punctuation for BPE training."""
    rng = random.Random(seed)
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 24))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        sentence = " ".join(words)
        yield sentence[0].upper() + sentence[1:] + rng.choice(".?!,;:")


def train_tokenizer(vocab_size: int) -> "tokenizers.Tokenizer":  # type: ignore[name-defined]  # noqa: F821
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # As llama: every encoded prompt starts with BOS (vLLM adds special tokens for completions).
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    return tok


def model_config(vocab_size: int, max_model_len: int, bos_id: int, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def write_model(out: Path, vocab_size: int = 2048, max_model_len: int = 4096) -> Path:
    """Write config.json, tokenizer.json and tokenizer_config.json into ``out``; return it."""
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_size)
    actual_vocab = tok.get_vocab_size()
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": max_model_len,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (out / "config.json").write_text(json.dumps(model_config(actual_vocab, max_model_len, bos_id, eos_id), indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args(argv)
    print(write_model(args.out, args.vocab_size, args.max_model_len))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
