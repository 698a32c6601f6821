"""What the routers read off Serve's pending requests: the prompt and the LoRA adapter of a
replica call, and the next open request of an internal request id that several calls share.

Like router.py, this never imports torch or the engine: the ingress and proxy processes load it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.request_router import PendingRequest


def oldest_open_with_id(queue: Iterable[PendingRequest], internal_request_id: str):
    """The oldest pending request of `queue` (arrival order) that carries this internal request
    id and is not done yet, else None.

    Serve's exact-match index keeps one pending request per internal request id, but every
    handle call made while serving one HTTP request inherits that request's id: the n choices of
    one chat request, or a batch job's lines, share it. The index then finds only the first of
    them and the others would wait forever; this scan finds the next one.
    """
    for pending in queue:
        if (
            not pending.future.done()
            and pending.metadata.internal_request_id == internal_request_id
        ):
            return pending
    return None


def prompt_of(pending_request: PendingRequest | None) -> Sequence[int] | None:
    """The prompt token ids of a replica call (generate_stream(GenerateRequest)), else None."""
    if pending_request is None or not pending_request.args:
        return None
    return getattr(pending_request.args[0], "prompt_token_ids", None)


def adapter_of(pending_request: PendingRequest | None) -> str | None:
    """The LoRA adapter a replica call names: a GenerateRequest's, or the AdapterRef that
    load_adapter validates (it goes where the adapter's requests will); else None."""
    if pending_request is None or not pending_request.args:
        return None
    arg = pending_request.args[0]
    ref = getattr(arg, "adapter", None) if hasattr(arg, "prompt_token_ids") else arg
    name = getattr(ref, "name", None)
    return name if isinstance(name, str) else None
