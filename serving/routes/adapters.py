"""vLLM's LoRA endpoints on the LLM ingress: POST /v1/load_lora_adapter and
/v1/unload_lora_adapter, with vLLM's bodies and answers (200 with a plain-text "Success: ...";
errors as OpenAI error bodies). Open when the app has no API key (server.api_key_env unset: local
use), else only to a caller presenting it, like every other route.

A load is validated by one running replica (`ModelReplica.load_adapter`: adapter_config.json,
the safetensors, shapes against the base model, rank against engine.max_lora_rank); only then
does the ingress serve the name (serving/llm/adapters.py). The other replicas, including ones
started later, register it from its path on the first request routed to them.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import PlainTextResponse

from serving.api.errors import ApiError
from serving.api.http import check_api_key, read_json, validate
from serving.api.lora import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from serving.llm.adapters import AdapterRegistry
from serving.llm.messages import AdapterRef, Failure

log = logging.getLogger("ray.serve")


class AdapterApi:
    def __init__(self, registry: AdapterRegistry, handles, available, api_key, max_body_bytes):
        self.registry = registry
        self.handles, self.available = handles, available
        self.api_key, self.max_body_bytes = api_key, max_body_bytes

    async def load(self, request: Request) -> PlainTextResponse:
        check_api_key(self.api_key, request)
        body = validate(LoadLoraAdapterRequest, await read_json(request, self.max_body_bytes))
        ref = self.registry.begin_load(body.lora_name, body.lora_path)
        ok = False
        try:
            await self._validate_on_a_replica(ref)
            ok = True
        finally:
            self.registry.finish_load(ref, ok)
        log.info("loaded LoRA adapter %r from %s", ref.name, ref.path)
        return PlainTextResponse(f"Success: LoRA adapter '{ref.name}' added successfully.")

    async def unload(self, request: Request) -> PlainTextResponse:
        check_api_key(self.api_key, request)
        body = validate(UnloadLoraAdapterRequest, await read_json(request, self.max_body_bytes))
        ref = self.registry.unload(body.lora_name)
        log.info("unloaded LoRA adapter %r (%s)", ref.name, ref.path)
        return PlainTextResponse(f"Success: LoRA adapter '{ref.name}' removed successfully.")

    async def _validate_on_a_replica(self, ref: AdapterRef) -> None:
        """One replica registers the adapter (hot first: it always runs); its refusal is a 400
        saying why."""
        pool = next((p for p in ("hot", "cold") if self.available.get(p)), None)
        if pool is None:
            raise ApiError(
                503, "no replica is running to validate the adapter; retry", retry_after_s=2.0
            )
        try:
            result = await self.handles[pool].load_adapter.remote(ref)
        except Exception as err:  # the replica died mid-call: nothing was registered for sure
            log.warning("validating adapter %r failed: %s", ref.name, type(err).__name__)
            raise ApiError(
                503, f"the {pool} replica failed while reading the adapter; retry",
                type_="server_error", retry_after_s=2.0,
            ) from None  # fmt: skip
        if isinstance(result, Failure):
            raise ApiError(result.status, result.message, param="lora_path")
