"""Stop strings: cut the text at the first one, holding back what could still become one.

The engine stops on token ids; strings can span tokens, so the ingress cuts them from text.
"""

from __future__ import annotations


class StopStrings:
    """Cut the text at the first stop string, holding back what could still become one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""
        self.stopped = False

    def feed(self, text: str, final: bool) -> str:
        """Returns the text that is safe to emit now."""
        if not self.stops:
            return text
        self.buffer += text
        cuts = [i for i in (self.buffer.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped = True
            out, self.buffer = self.buffer[: min(cuts)], ""
            return out
        if final:
            out, self.buffer = self.buffer, ""
            return out
        keep = min(self.hold, len(self.buffer))
        out = self.buffer[: len(self.buffer) - keep]
        self.buffer = self.buffer[len(out) :]
        return out
