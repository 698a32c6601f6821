"""The continuous-batching engine: pure Python + torch, never imports Ray."""

from serving.engine.config import EngineConfig
from serving.engine.engine import LLMEngine, StepTiming
from serving.engine.outputs import EngineDeadError, RequestOutput, RequestTimeoutError, StreamDelta
from serving.engine.sampling import SamplingParams
from serving.engine.sequence import Tier
from serving.engine.stats import EngineStats

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
