"""The continuous-batching engine: pure Python + torch, never imports Ray.

Names resolve lazily (PEP 562), so `from serving.engine import SamplingParams` or `EngineStats`
does not import torch: the ingress, the router and the autoscaler use those types without
loading the model stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "EngineConfig": "serving.engine.config",
    "LLMEngine": "serving.engine.engine",
    "StepTiming": "serving.engine.build",
    "EngineDeadError": "serving.engine.outputs",
    "RequestOutput": "serving.engine.outputs",
    "RequestTimeoutError": "serving.engine.outputs",
    "StreamDelta": "serving.engine.outputs",
    "SamplingParams": "serving.engine.sampling_params",
    "Tier": "common.tiers",
    "EngineStats": "serving.engine.stats",
}

__all__ = [
    "EngineConfig",
    "EngineDeadError",
    "EngineStats",
    "LLMEngine",
    "RequestOutput",
    "RequestTimeoutError",
    "SamplingParams",
    "StepTiming",
    "StreamDelta",
    "Tier",
]

if TYPE_CHECKING:
    from common.tiers import Tier
    from serving.engine.build import StepTiming
    from serving.engine.config import EngineConfig
    from serving.engine.engine import LLMEngine
    from serving.engine.outputs import (
        EngineDeadError,
        RequestOutput,
        RequestTimeoutError,
        StreamDelta,
    )
    from serving.engine.sampling_params import SamplingParams
    from serving.engine.stats import EngineStats


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'serving.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
