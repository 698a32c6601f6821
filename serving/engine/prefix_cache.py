"""Automatic prefix caching: the identity of a full KV block, and when caching may be on.

A full block's hash is chained over its parent's hash and its own token ids, so equal hashes
mean an equal prefix up to and including that block, hence equal KV (decision 9). The chain starts
from a salt naming everything else that changes the KV: the model, its dtype, and (a slot for
later) the LoRA adapter of the request. blake2b, not Python's hash(): ints hash to themselves in
CPython, so colliding prompts would be easy to craft, and a collision would serve another
prompt's KV. The router hashes the same way (serving/llm/router.py), across processes.

  block j of a sequence (tokens j*bs .. j*bs+bs-1):  h_j = H(h_{j-1} || tokens_j), h_-1 = H(salt)
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

DIGEST_BYTES = 16  # 128 bits: a collision in any pool is out of reach


def root_hash(model_key: str, dtype: str, adapter_id: str | None = None) -> bytes:
    """The chain's start: what besides the tokens decides the KV of a block."""
    salt = f"{model_key}\0{dtype}\0{adapter_id or ''}".encode()
    return hashlib.blake2b(salt, digest_size=DIGEST_BYTES).digest()


def adapter_root(root: bytes, adapter_name: str, epoch: int = 0) -> bytes:
    """The chain start of a request served through a LoRA adapter: the engine's root salted with
    the adapter's name and how many times that name was removed (KVLedger.forget_adapter), so
    weights registered again under the same name never meet the old ones' blocks."""
    h = hashlib.blake2b(root, digest_size=DIGEST_BYTES)
    h.update(f"\0adapter\0{adapter_name}\0{epoch}".encode())
    return h.digest()


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=DIGEST_BYTES)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def extend_block_hashes(
    hashes: list[bytes], token_ids: Sequence[int], block_size_tokens: int, root: bytes
) -> list[bytes]:
    """Append the hashes of the full blocks of `token_ids` that `hashes` does not cover yet
    (in place; also returned). Blocks already hashed are never rehashed: tokens only grow."""
    bs = block_size_tokens
    for j in range(len(hashes), len(token_ids) // bs):
        hashes.append(block_hash(hashes[-1] if hashes else root, token_ids[j * bs : (j + 1) * bs]))
    return hashes


def caching_refusal(group_windows: tuple[int | None, ...], paged: bool) -> str | None:
    """Why prefix caching must stay off for this model, or None when it may be on.

    Windowed paging groups free the blocks their window left (BlockPool.trim): a block some
    group already dropped cannot be shared, and a shared block must not be trimmed under another
    request. Rather than a subtly wrong cache, such models run without one. The plain HF runner
    keeps its KV outside the pool, so there is nothing to share either."""
    if not paged:
        return "the plain HF runner keeps its KV outside the block pool"
    if group_windows != (None,):
        return f"the model has sliding-window paging groups (windows {group_windows})"
    return None


def setup_prefix_cache(ledger: Any, cfg: Any, model_config: Any, dtype: str, paged: bool) -> bool:
    """Turn on prefix caching in `ledger` unless the config or the model rules it out (then
    say why in the log); returns whether it is on."""
    if not cfg.prefix_caching:
        return False
    why_not = caching_refusal(ledger.pool.group_windows, paged)
    if why_not is not None:
        log.warning("prefix caching is off for this model: %s", why_not)
        return False
    mc = model_config
    model_key = f"{getattr(mc, 'model_type', '')}:{getattr(mc, '_name_or_path', '')}"
    ledger.enable_prefix_caching(root_hash(model_key, dtype))
    return True
