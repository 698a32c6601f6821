"""Bits per quantised weight from a checkpoint's `quantization_config`, scales included.

Group-wise integer formats (GPTQ, AWQ) store `bits` per weight plus, per group of `group_size`
weights, one 16-bit scale and one `bits`-wide zero point; bitsandbytes 4-bit stores one float32
absmax per block of 64 (8-bit per 256 with double quantisation); FP8 checkpoints store one byte per
weight plus one float32 scale per weight block (or per tensor). An unknown method is refused by
name: a guessed size would be a silently wrong plan.
"""

from __future__ import annotations

from typing import Any

_SCALE_BITS = 16
_BNB_BLOCK = 64


def _group_overhead_bits(bits: float, group_size: Any) -> float:
    if not isinstance(group_size, int) or group_size <= 0:  # -1: one scale per output row
        return 0.0
    return (_SCALE_BITS + bits) / group_size


def quantized_bits_per_weight(qcfg: dict[str, Any]) -> float:
    """Average stored bits per quantised weight for this quantization_config."""
    method = str(qcfg.get("quant_method", "")).lower()
    if method in ("gptq", "awq", "autoround", "auto-round", "quark", "hqq"):
        bits = qcfg.get("bits", qcfg.get("w_bit", qcfg.get("nbits")))
        group = qcfg.get("group_size", qcfg.get("q_group_size"))
        if not isinstance(bits, int | float) or bits <= 0:
            raise ValueError(f"quantization_config ({method}) has no valid 'bits': {qcfg}")
        return float(bits) + _group_overhead_bits(float(bits), group)
    if method == "bitsandbytes":
        if qcfg.get("load_in_4bit"):
            double = qcfg.get("bnb_4bit_use_double_quant")
            return 4.0 + (8.0 / _BNB_BLOCK + 32.0 / (_BNB_BLOCK * 256) if double else 32.0 / 64)
        if qcfg.get("load_in_8bit"):
            return 8.0
        raise ValueError(f"quantization_config (bitsandbytes) loads neither 4 nor 8 bit: {qcfg}")
    if method == "compressed-tensors":
        return _compressed_tensors_bits(qcfg)
    if method in ("fp8", "fbgemm_fp8", "finegrained_fp8"):
        block = qcfg.get("weight_block_size")
        if isinstance(block, list | tuple) and len(block) == 2:
            return 8.0 + 32.0 / (block[0] * block[1])
        return 8.0
    raise ValueError(
        f"quantization_config quant_method={method!r} is not one the planner can size; known: "
        "gptq, awq, autoround, quark, hqq, bitsandbytes, fp8, fbgemm_fp8, compressed-tensors"
    )


def _compressed_tensors_bits(qcfg: dict[str, Any]) -> float:
    """compressed-tensors (llm-compressor): the first config group's weight scheme."""
    for group in (qcfg.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        bits = weights.get("num_bits")
        if isinstance(bits, int) and bits > 0:
            return float(bits) + _group_overhead_bits(float(bits), weights.get("group_size"))
    raise ValueError(f"quantization_config (compressed-tensors) names no weight num_bits: {qcfg}")
