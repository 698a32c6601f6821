"""The lean forward: Llama-family decoders run layer by layer without transformers' plumbing.

Why: at 16 decode rows on one CPU thread, a step of SmolLM2-135M (30 layers) spent about a third
of its time outside the matmuls, much of it in per-op dispatch and Python: transformers' forward
made ~6,600 torch calls a step (profiler, nested calls counted; rotary as seven ops a tensor,
views and reshapes to the [batch, heads, seq, dim] layout and back, keyword plumbing through
decorated modules). This forward computes the same thing in ~4,800 (docs/engine.md, "The runner"):

  - RMSNorm as x * rsqrt(mean(x^2) + eps) * w (transformers' arithmetic; float32 keeps no casts);
  - rotary as x * cos + swap_halves(x) * sin_signed, where sin_signed = (-sin1, sin2) once a
    step: the same products as x * cos + rotate_half(x) * sin (negation is exact);
  - the packed [T, heads, dim] layout throughout, handed to the paged attention as views;
  - the final norm and the LM head on the sampled rows only.

The projections are the model's own modules (packed, plain, or LoRA-wrapped), so weights are
not copied. Architectures: those whose decoder layer is Llama's (`LEAN_ARCHITECTURES`); every
other model keeps its own forward through the attention interface. Checked token for token
against generate() by tests/unit/engine/test_architectures.py and test_lean_forward.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from serving.engine import attention
from serving.engine.attention import PagedMetadata

# model_type -> decoder layer class: the layer's forward this module reproduces.
LEAN_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen3": "Qwen3DecoderLayer",  # adds RMSNorm on each head of q and k before the rotary
}


def _window(model_type: str, attn, config) -> int | None:
    """The sliding window transformers passes to attention for this layer."""
    if model_type == "mistral":  # every layer: getattr(config, "sliding_window", None)
        return getattr(config, "sliding_window", None)
    return getattr(attn, "sliding_window", None)  # qwen2/qwen3: per layer_types; llama: none


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: in float32, then weight x the result in the input dtype."""
    if x.dtype == torch.float32:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin for x [T, heads, D]; rotate_half(x) * sin equals
    roll(x, D/2) * (-sin1, sin2) exactly."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


@dataclass(slots=True)
class _Layer:
    in_norm: torch.Tensor
    in_eps: float
    post_norm: torch.Tensor
    post_eps: float
    q_proj: torch.nn.Module
    k_proj: torch.nn.Module
    v_proj: torch.nn.Module
    o_proj: torch.nn.Module
    gate_proj: torch.nn.Module
    up_proj: torch.nn.Module
    down_proj: torch.nn.Module
    q_norm: tuple[torch.Tensor, float] | None
    k_norm: tuple[torch.Tensor, float] | None
    spec: object  # attention._Spec


def _norm(module) -> tuple[torch.Tensor, float]:
    return module.weight, module.variance_epsilon


def supports(model) -> bool:
    """Whether `model` is a Llama-family causal LM this forward reproduces exactly."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    inner = getattr(model, "model", None)
    if kind not in LEAN_ARCHITECTURES or inner is None or not hasattr(model, "lm_head"):
        return False
    if getattr(config, "hidden_act", None) != "silu":
        return False
    layers = getattr(inner, "layers", ())
    return len(layers) > 0 and all(
        type(layer).__name__ == LEAN_ARCHITECTURES[kind] for layer in layers
    )


class LeanForward:
    """forward(ids [T], positions [T], paged, keep [K]) -> logits [K, vocab]."""

    def __init__(self, model) -> None:
        if not supports(model):
            raise ValueError(f"lean forward: {type(model).__name__} is not a Llama-family model")
        config = model.config
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = _norm(inner.norm)
        self.lm_head = model.lm_head
        self.layers: list[_Layer] = []
        for i, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            window = _window(config.model_type, attn, config)
            # through the module attributes, so a test that patches them sees its patch
            spec = attention._spec(attn, attn.scaling, 0.0, window, None, {})
            attention._check_window(attn, i, spec)
            qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            self.layers.append(
                _Layer(
                    *_norm(layer.input_layernorm),
                    *_norm(layer.post_attention_layernorm),
                    attn.q_proj,
                    attn.k_proj,
                    attn.v_proj,
                    attn.o_proj,
                    mlp.gate_proj,
                    mlp.up_proj,
                    mlp.down_proj,
                    None if qn is None else _norm(qn),
                    None if kn is None else _norm(kn),
                    spec,
                )
            )
        self.head_dim = attn.head_dim

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, paged: PagedMetadata, keep: torch.Tensor
    ) -> torch.Tensor:
        h = self.embed(ids)  # [T, hidden]
        cos, sin = self.rotary(h, positions.unsqueeze(0))  # [1, T, D] each
        half = self.head_dim // 2
        cos = cos[0].unsqueeze(1)  # [T, 1, D]
        sin_signed = torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1).unsqueeze(1)
        num_tokens, dim = h.shape[0], self.head_dim
        for i, layer in enumerate(self.layers):
            x = _rms(h, layer.in_norm, layer.in_eps)
            q = layer.q_proj(x).view(num_tokens, -1, dim)
            k = layer.k_proj(x).view(num_tokens, -1, dim)
            v = layer.v_proj(x).view(num_tokens, -1, dim)
            if layer.q_norm is not None:
                q = _rms(q, *layer.q_norm)
                k = _rms(k, *layer.k_norm)
            q = _rotate(q, cos, sin_signed)
            k = _rotate(k, cos, sin_signed)
            out = attention.attend(
                paged, i, layer.spec, q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            )
            h = h + layer.o_proj(out.view(num_tokens, -1))
            x = _rms(h, layer.post_norm, layer.post_eps)
            h = h + layer.down_proj(F.silu(layer.gate_proj(x)) * layer.up_proj(x))
        return self.lm_head(_rms(h[keep], *self.norm))
