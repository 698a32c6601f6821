"""The engine's C kernels: each built once per machine with the system's C compiler, loaded
through ctypes.

A kernel's source ships with the package. The first engine that asks for it compiles it with
`-march=native` into the tideserve cache (`$TIDESERVE_CACHE`, default ~/.cache/tideserve) under
a name hashing the kernel's name, its source, the flags and this CPU's feature flags: a later
start loads it in milliseconds, and a cache shared by different CPUs never loads another's
build. No compiler or a failed build is a reason (a string) the caller logs or raises; it never
breaks an engine that can do without the kernel.

ctypes releases the GIL for the call: the event loop runs meanwhile.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from serving.engine import dtypes
from serving.model_source import cache_root

log = logging.getLogger(__name__)


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(cc: str, source: Path, cflags: tuple[str, ...], out: Path) -> None:
    """Compile into a temporary file, then rename: replicas starting together never load half a
    file, and the last to finish wins with the same bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run(
            [cc, *cflags, "-o", tmp, str(source), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class NativeKernel:
    """One C source -> its entry point; `bind(lib)` declares the argument types and returns
    the function. `get()` builds or loads once per process."""

    def __init__(
        self,
        name: str,
        source: Path,
        cflags: tuple[str, ...],
        bind: Callable[[ctypes.CDLL], object],
    ) -> None:
        self.name = name
        self.source = source
        self.cflags = cflags
        self.bind = bind
        self._lock = threading.Lock()
        self._fn: object = None  # the bound function once loaded, or why not (str)

    def library_path(self, root: Path, source: bytes, cpu_flags: frozenset[str]) -> Path:
        """Where this source, built with these flags for a CPU with these flags, is cached."""
        key = hashlib.sha256(
            source + " ".join(self.cflags).encode() + " ".join(sorted(cpu_flags)).encode()
        )
        return root / "kernels" / f"{self.name}-{key.hexdigest()[:16]}.so"

    def load(self) -> object:
        """The bound function, built first when not cached; or why not (a string)."""
        path = self.library_path(cache_root(), self.source.read_bytes(), dtypes.read_cpu_flags())
        if not path.exists():
            cc = compiler()
            if cc is None:
                return "no C compiler found ($CC, cc or gcc)"
            try:
                _build(cc, self.source, self.cflags, path)
            except subprocess.CalledProcessError as err:
                return f"the C compiler failed: {err.stderr.strip()[:300]}"
            except (OSError, subprocess.TimeoutExpired) as err:
                return f"the kernel could not be built: {err}"
            log.info("built the %s kernel: %s", self.name, path)
        try:
            return self.bind(ctypes.CDLL(str(path)))
        except (OSError, AttributeError) as err:
            return f"the kernel did not load: {err}"

    def get(self) -> tuple[object | None, str | None]:
        """(the function, None) or (None, why not). Called per layer per step: once set, the
        answer is read without taking the lock."""
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    self._fn = self.load()
        return (None, self._fn) if isinstance(self._fn, str) else (self._fn, None)
