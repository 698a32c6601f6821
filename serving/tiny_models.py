"""Tiny random-weight models and an offline-trained tokenizer, for tests and benchmarks.

Nothing here downloads anything: the model is built from a config, the tokenizer is a byte-level BPE
trained in a second on text that ships with Python's standard library.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import pathlib

import torch

TINY_VOCAB_SIZE = 512


def _stdlib_corpus(max_chars: int = 400_000) -> list[str]:
    """Docstrings and source of a few stdlib modules: English and code, always on disk."""
    import argparse
    import asyncio.events
    import collections
    import dataclasses
    import json as json_mod

    lines: list[str] = []
    total = 0
    for mod in (collections, dataclasses, argparse, json_mod, asyncio.events):
        for line in inspect.getsource(mod).splitlines():
            if line.strip():
                lines.append(line)
                total += len(line)
        if total > max_chars:
            break
    return lines


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE):
    """A byte-level BPE `PreTrainedTokenizerFast` with a chat template; any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast


# The "Llama-shaped model of a few million parameters" that the engine benchmark, the serving
# overhead benchmark and capacity calibration share (3.2 M parameters with a 512-token vocab).
SMALL_LLAMA = dict(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
)


# What each tiny architecture adds over the shared shape below (tests/unit/
# test_engine_architectures.py checks each against generate()). Windows are short so test prompts
# pass them; Gemma 2's soft-cap is low so the tanh bends real logits.
TINY_ARCHS: dict[str, dict] = {
    "llama": dict(num_key_value_heads=4),  # MHA
    "qwen2": dict(num_key_value_heads=2),  # GQA, attention biases
    # Qwen2's per-layer pattern: layers >= max_window_layers slide, the others see everything.
    "qwen2-sliding": dict(
        num_key_value_heads=2, use_sliding_window=True, sliding_window=24, max_window_layers=1
    ),
    "qwen3": dict(num_key_value_heads=2, head_dim=32),  # q/k norms, explicit head_dim
    "mistral": dict(num_key_value_heads=2, sliding_window=24),  # every layer slides
    "phi3": dict(num_key_value_heads=4, sliding_window=20, pad_token_id=0),  # fused QKV
    "gemma2": dict(  # sliding/full alternating, soft-capped logits, final soft-cap
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=16,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=16,
    ),
    "mixtral": dict(  # mixture of experts (4 experts, top 2) with a sliding window
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=32
    ),
}
_CONFIG_CLASS = {"qwen2-sliding": "qwen2"}


def tiny_config(arch: str = "llama", **overrides):
    """Config of a tiny decoder of one of TINY_ARCHS ("llama" is MHA, "qwen2" GQA...)."""
    from transformers import AutoConfig

    if arch not in TINY_ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {sorted(TINY_ARCHS)}")
    common = dict(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=1024,
        # Random weights at the usual 0.02 give near-uniform logits, where float rounding alone
        # can flip an argmax; a wider init peaks the distribution, so greedy equality is fair.
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
    )
    model_type = _CONFIG_CLASS.get(arch, arch)
    return AutoConfig.for_model(model_type, **{**common, **TINY_ARCHS[arch], **overrides})


def tiny_model(arch: str = "llama", seed: int = 0, dtype=torch.float32, **overrides):
    """A random-weight causal LM built from `tiny_config`, deterministic for a given seed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=dtype)
    return model.eval()


def save_tiny_model_dir(path: str | os.PathLike, arch: str = "llama", seed: int = 0, **overrides):
    """Write a tiny model and its tokenizer to a directory, as a user's local model dir would be."""
    path = pathlib.Path(path)
    model = tiny_model(arch, seed, **overrides)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    gen = path / "generation_config.json"
    if gen.exists():  # keep EOS consistent with the tokenizer so generate() and the engine agree
        data = json.loads(gen.read_text())
        data["eos_token_id"] = model.config.eos_token_id
        gen.write_text(json.dumps(data))
    return path


def save_tiny_embedding_dir(path: str | os.PathLike, seed: int = 0, max_seq_length: int = 64):
    """A tiny random BERT laid out as a sentence-transformers dir (mean pooling, normalize)."""
    from transformers import BertConfig, BertModel

    path = pathlib.Path(path)
    cfg = BertConfig(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    BertModel(cfg).eval().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return path
