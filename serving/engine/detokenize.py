"""Incremental detokenization: each step decodes a short window, not the whole output.

Decoding all output tokens every step costs O(n) per token, O(n^2) per request. Instead keep two
offsets into the token list: text up to `read` is emitted; decoding from `prefix` (one chunk
back) gives the tokenizer the context it needs for spaces and merges. The new text is
decode(ids[prefix:]) minus decode(ids[prefix:read]). A trailing U+FFFD means a UTF-8 character
is split across tokens: wait for its other bytes (unless the request has finished).
"""

from __future__ import annotations

from collections.abc import Callable


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.prefix = 0
        self.read = 0

    def step(self, ids: list[int], final: bool) -> str:
        """New text for output token ids `ids` (all of them so far)."""
        emitted = self.decode(ids[self.prefix : self.read])
        text = self.decode(ids[self.prefix :])
        if text.endswith("\ufffd") and not final:
            return ""
        if len(text) <= len(emitted) or not text.startswith(emitted):
            return ""
        self.prefix, self.read = self.read, len(ids)
        return text[len(emitted) :]
