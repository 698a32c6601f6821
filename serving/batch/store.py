"""The on-disk store of the offline lane: uploaded files, batch records, per-line result journals.

Layout under `batch_api.store_path` (docs/batch.md, "On-disk format"):

    files/<file_id>.json            the FileObject (OpenAI's fields)
    files/<file_id>.data            the file's bytes, as uploaded or as written at finalization
    batches/<batch_id>.json         the batch record: {"batch": <Batch>, "lane": <tideserve's own>}
    batches/<batch_id>.results.jsonl  one JSON line per request that finished, in finishing order

Records are replaced atomically (write a temporary file, fsync, rename, fsync the directory), so
a crash leaves the old record or the new one, never half of one. The journal is append-only with
one write + fsync per line; a crash mid-write can leave only its LAST line torn, and that line is
cut off on the next read: its request was never recorded as answered, so it runs again, once.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import uuid

FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"


def new_file_id() -> str:
    return FILE_ID_PREFIX + uuid.uuid4().hex[:24]


def new_batch_id() -> str:
    return BATCH_ID_PREFIX + uuid.uuid4().hex[:24]


def _safe_id(value: str, prefix: str) -> str:
    """Ids come from URLs: refuse anything that could name a path outside the store."""
    rest = value[len(prefix) :] if value.startswith(prefix) else ""
    if not rest or not rest.isalnum():
        raise KeyError(value)
    return value


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class BatchStore:
    """Files and batches under one directory. Thread-safe for the journal appends."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = pathlib.Path(root).expanduser()
        self.files = self.root / "files"
        self.batches = self.root / "batches"
        self.files.mkdir(parents=True, exist_ok=True)
        self.batches.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    # ----- files -------------------------------------------------------------------------------
    def put_file(self, meta: dict, data: bytes) -> dict:
        """Store bytes then metadata: a file is listed only once its bytes are on disk."""
        fid = _safe_id(meta["id"], FILE_ID_PREFIX)
        write_atomic(self.files / f"{fid}.data", data)
        write_atomic(self.files / f"{fid}.json", json.dumps(meta).encode())
        return meta

    def get_file(self, file_id: str) -> dict:
        path = self.files / f"{_safe_id(file_id, FILE_ID_PREFIX)}.json"
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            raise KeyError(file_id) from None

    def file_content(self, file_id: str) -> bytes:
        self.get_file(file_id)
        return (self.files / f"{file_id}.data").read_bytes()

    def delete_file(self, file_id: str) -> None:
        self.get_file(file_id)
        (self.files / f"{file_id}.json").unlink()  # metadata first: never a listed file sans bytes
        (self.files / f"{file_id}.data").unlink(missing_ok=True)
        _fsync_dir(self.files)

    def list_files(self) -> list[dict]:
        paths = sorted(self.files.glob(f"{FILE_ID_PREFIX}*.json"))
        return [json.loads(p.read_bytes()) for p in paths]

    # ----- batches -----------------------------------------------------------------------------
    def save_batch(self, record: dict) -> None:
        bid = _safe_id(record["batch"]["id"], BATCH_ID_PREFIX)
        write_atomic(self.batches / f"{bid}.json", json.dumps(record).encode())

    def get_batch(self, batch_id: str) -> dict:
        path = self.batches / f"{_safe_id(batch_id, BATCH_ID_PREFIX)}.json"
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            raise KeyError(batch_id) from None

    def load_batches(self) -> list[dict]:
        paths = self.batches.glob(f"{BATCH_ID_PREFIX}*.json")
        return [json.loads(p.read_bytes()) for p in paths]

    def _journal(self, batch_id: str) -> pathlib.Path:
        return self.batches / f"{_safe_id(batch_id, BATCH_ID_PREFIX)}.results.jsonl"

    def append_result(self, batch_id: str, entry: dict) -> None:
        """One line, one write, fsync'd before the caller counts the request as answered."""
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        with self._lock:
            fd = os.open(self._journal(batch_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def read_results(self, batch_id: str) -> dict[int, dict]:
        """Journal entries by input line index; a torn last line is cut off the file."""
        path = self._journal(batch_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        results: dict[int, dict] = {}
        good = 0
        for line in raw.splitlines(keepends=True):
            try:
                if not line.endswith(b"\n"):
                    raise ValueError("torn")
                entry = json.loads(line)
            except ValueError:
                break
            results.setdefault(int(entry["index"]), entry)  # the first answer is the answer
            good += len(line)
        if good < len(raw):
            with self._lock, open(path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        return results
