"""The bodies of vLLM's LoRA endpoints (vllm/entrypoints/serve/lora/protocol.py), strict like
every other body here: an unknown field is a 400 naming it, and a field vLLM has that tideserve
does not implement is a 400 naming it rather than silently ignored.

    POST /v1/load_lora_adapter    {"lora_name": ..., "lora_path": ...}
    POST /v1/unload_lora_adapter  {"lora_name": ...}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

_STRICT = ConfigDict(extra="forbid", strict=True)


class LoadLoraAdapterRequest(BaseModel):
    model_config = _STRICT

    lora_name: str
    lora_path: str  # a directory on the replicas' disk: adapter_config.json + safetensors
    load_inplace: bool = False
    is_3d_lora_weight: bool = False

    @model_validator(mode="after")
    def _implemented(self) -> LoadLoraAdapterRequest:
        if self.load_inplace:
            raise ValueError(
                "load_inplace=true is not implemented; unload the adapter, then load it again"
            )
        if self.is_3d_lora_weight:
            raise ValueError("is_3d_lora_weight=true (MoE expert adapters) is not implemented")
        return self


class UnloadLoraAdapterRequest(BaseModel):
    model_config = _STRICT

    lora_name: str
    lora_int_id: int | None = None  # vLLM's field; it names adapters by lora_name too
