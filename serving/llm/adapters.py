"""The ingress's LoRA adapters: which names a request's `model` may use, as vLLM's OpenAI server
keeps them (vllm/entrypoints/openai/models/serving.py).

    declared   model.adapters in cluster.yaml; every replica registers them at start
    loaded     POST /v1/load_lora_adapter {"lora_name", "lora_path"}: one replica validates the
               adapter (the ingress has no weights to check it against), then the name is
               served; other replicas register it lazily from the path on their first request
    unloaded   POST /v1/unload_lora_adapter {"lora_name"}: requests naming it are a 404 again

Check-then-commit like every allocator here: `begin_load` checks the request and reserves the
name (a second load of it while the first is validated is refused), `finish_load` commits or
releases it. Errors are ApiErrors with vLLM's statuses: 400 for a bad load, 404 for a name that
is not served. Pure: no Ray, no I/O; the HTTP routes (serving/routes/adapters.py) do the calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from serving.api.errors import ApiError
from serving.llm.messages import DECLARED, AdapterRef


class AdapterRegistry:
    def __init__(self, base_name: str, declared: Mapping[str, str], max_loras: int) -> None:
        self.base_name = base_name
        self.max_loras = max_loras
        self.served: dict[str, AdapterRef] = {
            name: AdapterRef(name, path, DECLARED) for name, path in declared.items()
        }
        self._loading: set[str] = set()
        self._load_ids = itertools.count(1)

    # ----- requests ------------------------------------------------------------------------
    def resolve(self, model: str | None) -> AdapterRef | None:
        """The adapter a request's `model` names; None for the base model (or no `model`).
        Anything else is a 404 naming the model and what is served."""
        if not model or model == self.base_name:
            return None
        ref = self.served.get(model)
        if ref is None:
            raise ApiError(
                404,
                f"model {model!r} does not exist; this server serves {self.names()}",
                param="model",
                code="model_not_found",
            )
        return ref

    def names(self) -> list[str]:
        return [self.base_name, *sorted(self.served)]

    def cards(self) -> list[dict]:
        """/v1/models entries of the adapters, as vLLM lists them: `root` is the adapter's path
        and `parent` the base model's id."""
        return [
            {
                "id": ref.name,
                "object": "model",
                "created": 0,
                "owned_by": "tideserve",
                "root": ref.path,
                "parent": self.base_name,
            }
            for ref in sorted(self.served.values(), key=lambda r: r.name)
        ]

    # ----- load / unload (vLLM's checks and statuses) --------------------------------------
    def begin_load(self, name: str, path: str) -> AdapterRef:
        """Check a load request and reserve its name; finish_load commits or releases it."""
        if self.max_loras < 1:
            raise ApiError(
                400,
                "this server serves no LoRA adapters: engine.max_loras is 0 (set it >= 1)",
                param="lora_name",
            )
        if not name.strip() or not path.strip():
            raise ApiError(
                400, "Both 'lora_name' and 'lora_path' must be provided.", param="lora_name"
            )
        if name == self.base_name:
            raise ApiError(
                400,
                f"The lora adapter {name!r} conflicts with a served base model.",
                param="lora_name",
            )
        if name in self.served or name in self._loading:
            raise ApiError(
                400,
                f"The lora adapter {name!r} has already been loaded; unload it first to load "
                "another path under this name.",
                param="lora_name",
            )
        self._loading.add(name)
        return AdapterRef(name, path, f"load-{next(self._load_ids)}")

    def finish_load(self, ref: AdapterRef, ok: bool) -> None:
        self._loading.discard(ref.name)
        if ok:
            self.served[ref.name] = ref

    def unload(self, name: str) -> AdapterRef:
        if not name:
            raise ApiError(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                param="lora_name",
            )
        ref = self.served.pop(name, None)
        if ref is None:
            raise ApiError(
                404,
                f"The lora adapter {name!r} cannot be found; loaded: {sorted(self.served)}",
                param="lora_name",
                code="model_not_found",
            )
        return ref
