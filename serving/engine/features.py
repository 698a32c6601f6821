"""Fail closed on model features (decision 7, docs/design.md): what the paged attention serves.

Two checks, one list of names:
  - at load, `check_model(config, runner)` reads the model's config and refuses an architecture
    or attention feature the engine does not implement, naming the feature and the model;
  - at every forward, `attention.py` refuses an attention keyword it does not implement (an
    argument the model passes and we would otherwise drop), naming it and the module.

Served by the paged attention (each verified token for token against `generate()` in
tests/unit/engine/test_architectures.py): causal self-attention with any number of KV heads,
sliding windows (one for every layer, or per layer from `layer_types`) and attention-logit
soft-capping. The architectures below are the ones verified; others are refused by the paged
runner, and may run on the plain runner (`runner: hf`), which runs the model's own attention.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# model_type -> what it adds over Llama; each is a tiny config in serving/tiny_models.py.
VERIFIED_ARCHITECTURES: dict[str, str] = {
    "llama": "causal, grouped-query attention (also SmolLM, Llama 2/3)",
    "mistral": "sliding window on every layer",
    "mixtral": "mixture of experts, optional sliding window",
    "qwen2": "attention biases; sliding window on layers >= max_window_layers",
    "qwen3": "q/k norms; optional sliding window",
    "phi3": "fused QKV, sliding window",
    "gemma2": "soft-capped attention logits, alternating sliding/full layers",
}
LAYER_TYPES_SERVED = frozenset({"full_attention", "sliding_attention"})

# Attention keywords the model code passes through without meaning anything to attention.
PASS_THROUGH_KWARGS = frozenset({"position_ids", "use_cache", "cache_position"})
# Keywords with a meaning we do not implement: refused with these names.
REFUSED_KWARGS: dict[str, str] = {
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
    "position_bias": "relative position bias",
    "indices": "sparse attention (top-k key selection)",
    "attention_chunk_size": "chunked attention",
}


class UnsupportedModelError(ValueError):
    """A model, or one of its features, that the engine refuses rather than serves wrongly."""


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    why: str  # the config key or value that shows it


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def model_name(config: Any) -> str:
    """`<model_type> (<name or path>)`, what every refusal calls the model."""
    kind = _get(config, "model_type") or "unknown model_type"
    path = _get(config, "_name_or_path") or _get(config, "name_or_path") or ""
    return f"{kind} ({path})" if path else str(kind)


def _layer_type_features(config: Any) -> Iterable[Feature]:
    types = _get(config, "layer_types") or ()
    for kind in sorted(set(types) - LAYER_TYPES_SERVED):
        name = {
            "chunked_attention": "chunked attention",
            "linear_attention": "linear attention",
        }.get(kind, f"layer type {kind!r}")
        yield Feature(name, f"layer_types contains {kind!r}")


def unsupported_features(config: Any) -> list[Feature]:
    """Attention features in `config` that the paged attention does not implement."""
    found: list[Feature] = []
    if _get(config, "is_encoder_decoder") or _get(config, "add_cross_attention"):
        found.append(Feature("cross-attention", "is_encoder_decoder / add_cross_attention"))
    if _get(config, "cross_attention_layers"):
        found.append(Feature("cross-attention", "cross_attention_layers"))
    if _get(config, "kv_lora_rank") or _get(config, "q_lora_rank"):
        found.append(Feature("latent attention (MLA)", "kv_lora_rank / q_lora_rank"))
    attn_config = _get(config, "attn_config") or {}
    alibi = (
        _get(config, "alibi")
        or _get(config, "position_embedding_type") == "alibi"
        or _get(attn_config, "alibi")
        or _get(config, "model_type") == "bloom"
    )
    if alibi:
        found.append(Feature("ALiBi position biases", "alibi"))
    if _get(config, "model_type") == "gpt_oss" or _get(config, "use_sinks"):
        found.append(Feature("attention sinks", "learned per-head sink logits"))
    if _get(config, "attention_chunk_size"):
        found.append(Feature("chunked attention", "attention_chunk_size"))
    if isinstance(_get(config, "num_key_value_heads"), list | tuple):
        found.append(Feature("per-layer KV head counts", "num_key_value_heads is a list"))
    found.extend(_layer_type_features(config))
    return found


def check_model(config: Any, runner: str) -> None:
    """Raise UnsupportedModelError naming each feature (and the model) the engine cannot serve.

    runner "paged"/"auto": the paged attention must implement every attention feature, and the
    architecture must be one verified against generate(). runner "hf": the model's own attention
    runs, but the features above still change what the KV cache holds, so they are refused too.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    refused = unsupported_features(text)
    name = model_name(text)
    if refused:
        listed = "; ".join(f"{f.name} ({f.why})" for f in refused)
        raise UnsupportedModelError(
            f"model {name} uses attention features the engine does not implement: {listed}. "
            "Refusing to serve it rather than answer wrongly."
        )
    kind = _get(text, "model_type")
    if runner != "hf" and kind not in VERIFIED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"model {name}: architecture {kind!r} is not verified against generate() by the "
            f"paged attention; verified: {sorted(VERIFIED_ARCHITECTURES)}. Set engine.runner: hf "
            "to run the model's own attention, one sequence at a time."
        )


def check_attention_kwargs(module: Any, kwargs: dict[str, Any]) -> None:
    """Refuse an attention keyword the paged attention would otherwise ignore."""
    for key, value in kwargs.items():
        if key in PASS_THROUGH_KWARGS:
            continue
        if key == "output_attentions" and not value:
            continue
        if key == "is_causal" and value in (None, True):
            continue
        if key == "output_router_logits":  # MoE routing, consumed outside attention
            continue
        owner = f"{type(module).__name__} of model {model_name(getattr(module, 'config', {}))}"
        if key in REFUSED_KWARGS and value is not None:
            raise UnsupportedModelError(
                f"{owner} passes {key}= ({REFUSED_KWARGS[key]}), which the paged attention does "
                "not implement; refusing rather than ignoring it"
            )
        if key in REFUSED_KWARGS:
            continue
        raise UnsupportedModelError(
            f"{owner} passes the attention argument {key}={_short(value)}, which the paged "
            "attention does not implement; refusing rather than ignoring it"
        )


def _short(value: Any) -> str:
    text = repr(value) if not hasattr(value, "shape") else f"<tensor {tuple(value.shape)}>"
    return text if len(text) < 60 else text[:57] + "..."
