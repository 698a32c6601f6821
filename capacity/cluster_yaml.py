"""`write_pools`: put a plan's replica counts into an existing cluster.yaml, touching nothing else.

A YAML round trip (load + dump) would drop every comment and reflow the file, so this is a small
line-based editor instead. It understands exactly the shape `cluster.yaml` uses:

    applications:
      - name: ...
        args:
          pools:
            hot: {num_replicas: 1, resources: {}}     # flow mapping on one line, or a block
            cold:                                     # block, or a one-line flow mapping
              min_replicas: 0
              max_replicas: 2
              initial_replicas: 1

and rewrites only the integer values of `hot.num_replicas`, `cold.max_replicas` and (when it must be
clamped into [min_replicas, max_replicas]) `cold.initial_replicas`. A missing key is added next to
its siblings. Anything it does not recognise (no `args:`/`pools:`, two candidate `pools:` blocks,
a non-integer value, an anchor or alias) raises ValueError before the file is written. After
writing, the file is re-validated with `serving.config.load_cluster_yaml`; if that fails, the
original bytes are written back and the ValueError is re-raised.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_KEY_RE = re.compile(r"^(?P<indent>[ ]*)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")
_INT_RE = re.compile(r"^-?\d+$")


def _split_eol(line: str) -> tuple[str, str]:
    body = line.rstrip("\r\n")
    return body, line[len(body) :]


def _strip_comment(text: str) -> tuple[str, str]:
    """(content, ' # comment' part) of the text after a `key:`; quotes respected."""
    quote = None
    for k, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1] in " \t"):
            content = text[:k].rstrip()
            return content, text[len(content) :]
    content = text.rstrip()
    return content, text[len(content) :]


def _is_blank_or_comment(line: str) -> bool:
    s = line.strip()
    return not s or s.startswith("#")


def _indent(line: str) -> int:
    if "\t" in line[: len(line) - len(line.lstrip())]:
        raise ValueError("tab indentation is not supported")
    return len(line) - len(line.lstrip(" "))


@dataclass
class _Block:
    """Children (key -> line index) of a block mapping spanning lines [start, end)."""

    start: int
    end: int
    child_indent: int | None
    children: dict[str, int] = field(default_factory=dict)


def _block(lines: list[str], key_line: int) -> _Block:
    """The block mapping under the `key:` on `key_line` (which has nothing after the colon)."""
    parent = _indent(lines[key_line])
    end = key_line + 1
    while end < len(lines) and (_is_blank_or_comment(lines[end]) or _indent(lines[end]) > parent):
        end += 1
    while end > key_line + 1 and _is_blank_or_comment(lines[end - 1]):
        end -= 1  # trailing comments belong to whatever follows
    block = _Block(key_line + 1, end, None)
    for n in range(key_line + 1, end):
        if _is_blank_or_comment(lines[n]):
            continue
        ind = _indent(lines[n])
        if block.child_indent is None:
            block.child_indent = ind
        if ind == block.child_indent:
            m = _KEY_RE.match(_split_eol(lines[n])[0])
            if not m:
                raise ValueError(f"line {n + 1}: expected `key: value`, got {lines[n].strip()!r}")
            if m["key"] in block.children:
                raise ValueError(f"line {n + 1}: duplicate key {m['key']!r}")
            block.children[m["key"]] = n
        elif ind < block.child_indent:
            raise ValueError(f"line {n + 1}: inconsistent indentation")
    return block


def _value(lines: list[str], n: int) -> str:
    m = _KEY_RE.match(_split_eol(lines[n])[0])
    assert m
    return _strip_comment(m["rest"])[0].strip()


# --- one-line flow mappings: {a: 1, b: {}} --------------------------------------------------------


def _flow_entries(text: str, offset: int) -> tuple[dict[str, tuple[int, int]], int]:
    """Top-level `key: value` spans of the flow mapping starting at text[offset] == '{'.

    Returns ({key: (value_start, value_end)}, index of the closing brace).
    """
    depth, quote, entry_start = 0, None, offset + 1
    entries: dict[str, tuple[int, int]] = {}

    def add(start: int, stop: int) -> None:
        chunk = text[start:stop]
        if not chunk.strip():
            return
        if ":" not in chunk:
            raise ValueError(f"flow mapping entry {chunk.strip()!r} has no ':'")
        key, _, _ = chunk.partition(":")
        key = key.strip()
        vstart = start + chunk.index(":") + 1
        while vstart < stop and text[vstart] == " ":
            vstart += 1
        vend = stop
        while vend > vstart and text[vend - 1] == " ":
            vend -= 1
        if key in entries:
            raise ValueError(f"duplicate key {key!r} in a flow mapping")
        entries[key] = (vstart, vend)

    for k in range(offset, len(text)):
        ch = text[k]
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                add(entry_start, k)
                return entries, k
        elif ch == "," and depth == 1:
            add(entry_start, k)
            entry_start = k + 1
    raise ValueError("flow mapping is not closed on its line")


# --- the mapping nodes `hot` and `cold`, whichever style --------------------------------------


class _Node:
    """`hot` or `cold` under `pools:`: a block mapping or a one-line flow mapping."""

    def __init__(self, lines: list[str], line: int, name: str) -> None:
        self.lines, self.line, self.name = lines, line, name
        content = _strip_comment(_KEY_RE.match(_split_eol(lines[line])[0])["rest"])[0].strip()
        if content == "":
            self.flow = False
        elif content.startswith("{") and content.endswith("}"):
            self.flow = True
        else:
            raise ValueError(
                f"line {line + 1}: pools.{name} must be a mapping (block or {{...}}), "
                f"got {content!r}"
            )

    def _int(self, key: str, raw: str) -> int:
        if not _INT_RE.match(raw):
            raise ValueError(f"pools.{self.name}.{key}={raw!r} is not an integer literal")
        return int(raw)

    def get(self, key: str) -> int | None:
        if self.flow:
            body, _ = _split_eol(self.lines[self.line])
            entries, _ = _flow_entries(body, body.index("{"))
            if key not in entries:
                return None
            a, b = entries[key]
            return self._int(key, body[a:b])
        children = _block(self.lines, self.line).children
        return self._int(key, _value(self.lines, children[key])) if key in children else None

    def set(self, key: str, value: int) -> None:
        if self.flow:
            body, eol = _split_eol(self.lines[self.line])
            brace = body.index("{")
            entries, close = _flow_entries(body, brace)
            if key in entries:
                a, b = entries[key]
                body = body[:a] + str(value) + body[b:]
            elif entries:
                body = body[: brace + 1] + f"{key}: {value}, " + body[brace + 1 :]
            else:
                body = body[: brace + 1] + f"{key}: {value}" + body[close:]
            self.lines[self.line] = body + eol
            return
        block = _block(self.lines, self.line)
        if key in block.children:
            n = block.children[key]
            body, eol = _split_eol(self.lines[n])
            m = _KEY_RE.match(body)
            content, comment = _strip_comment(m["rest"])
            lead = content[: len(content) - len(content.lstrip())]
            self.lines[n] = f"{m['indent']}{key}:{lead}{value}{comment}{eol}"
            return
        indent = block.child_indent
        if indent is None:
            indent = _indent(self.lines[self.line]) + 2
        eol = _split_eol(self.lines[self.line])[1] or "\n"
        where = max(block.children.values()) + 1 if block.children else self.line + 1
        self.lines.insert(where, f"{' ' * indent}{key}: {value}{eol}")


def _find_pools(lines: list[str]) -> int:
    candidates = []
    for n, line in enumerate(lines):
        if _is_blank_or_comment(line):
            continue
        m = _KEY_RE.match(_split_eol(line)[0])
        if m and m["key"] == "args" and _strip_comment(m["rest"])[0].strip() == "":
            block = _block(lines, n)
            if "pools" in block.children:
                candidates.append(block.children["pools"])
    if not candidates:
        raise ValueError("no `pools:` block under an application's `args:`")
    if len(candidates) > 1:
        where = ", ".join(str(c + 1) for c in candidates)
        raise ValueError(f"more than one `pools:` block under `args:` (lines {where}); ambiguous")
    pools = candidates[0]
    if _value(lines, pools) != "":
        raise ValueError(f"line {pools + 1}: `pools:` must be a block mapping, not inline")
    return pools


def _pool_node(lines: list[str], pools_line: int, name: str) -> _Node:
    children = _block(lines, pools_line).children
    unknown = set(children) - {"hot", "cold"}
    if unknown:
        raise ValueError(f"pools has unrecognised keys {sorted(unknown)}")
    if name not in children:
        raise ValueError(f"pools.{name} is missing; add it before writing replica counts")
    return _Node(lines, children[name], name)


def write_pools(path: str | os.PathLike, hot_replicas: int, cold_max_replicas: int) -> str:
    """Set pools.hot.num_replicas and pools.cold.max_replicas in the cluster.yaml at `path`.

    Every other byte is kept. cold.initial_replicas is clamped into [min_replicas, max_replicas].
    Returns a human-readable summary of what changed ("no change" when nothing did). Raises
    ValueError (file untouched) if the structure is not recognised or the numbers are invalid;
    if the written file fails `load_cluster_yaml`, the original is restored and the error re-raised.
    """
    from serving.config import load_cluster_yaml
    from serving.config.sections import ColdPool

    for name, v, lo in (
        ("hot_replicas", hot_replicas, 1),
        ("cold_max_replicas", cold_max_replicas, 0),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    p = Path(path)
    original = p.read_bytes()
    text = original.decode("utf-8")
    lines = text.splitlines(keepends=True)

    pools = _find_pools(lines)
    pools_block = _block(lines, pools)
    for n in range(pools, pools_block.end):
        content = _strip_comment(_split_eol(lines[n])[0])[0]
        if re.search(r"(^|[\s:,{\[])[&*!]|<<:", content):
            raise ValueError(
                f"line {n + 1}: YAML anchors, aliases or tags in pools are not supported"
            )
    hot = _pool_node(lines, pools, "hot")
    old_hot = hot.get("num_replicas")
    hot.set("num_replicas", hot_replicas)
    # hot.set may insert a line, so locate cold afterwards.
    cold = _pool_node(lines, _find_pools(lines), "cold")
    defaults = ColdPool()
    old_max = cold.get("max_replicas")
    cold_min = cold.get("min_replicas")
    cold_min = defaults.min_replicas if cold_min is None else cold_min
    if cold_max_replicas < cold_min:
        raise ValueError(
            f"cold_max_replicas={cold_max_replicas} is below pools.cold.min_replicas={cold_min} in "
            f"{os.fspath(path)}; lower min_replicas first"
        )
    cold.set("max_replicas", cold_max_replicas)
    old_init = cold.get("initial_replicas")
    init = defaults.initial_replicas if old_init is None else old_init
    new_init = min(max(init, cold_min), cold_max_replicas)

    changes = []
    if old_hot != hot_replicas:
        changes.append(f"pools.hot.num_replicas: {old_hot} -> {hot_replicas}")
    if old_max != cold_max_replicas:
        changes.append(f"pools.cold.max_replicas: {old_max} -> {cold_max_replicas}")
    if new_init != init:
        cold.set("initial_replicas", new_init)
        changes.append(
            f"pools.cold.initial_replicas: {old_init} -> {new_init} "
            f"(clamped into [min_replicas={cold_min}, max_replicas={cold_max_replicas}])"
        )
    if not changes:
        return (
            f"{os.fspath(path)}: no change "
            f"(pools already hot={hot_replicas}, cold max={cold_max_replicas})"
        )

    new_text = "".join(lines)
    p.write_bytes(new_text.encode("utf-8"))
    try:
        cfg = load_cluster_yaml(p)
        if (cfg.pools.hot.num_replicas, cfg.pools.cold.max_replicas) != (
            hot_replicas,
            cold_max_replicas,
        ):
            raise ValueError(
                "the edited file does not read back the new numbers "
                f"(hot={cfg.pools.hot.num_replicas}, cold max={cfg.pools.cold.max_replicas})"
            )
    except Exception as err:
        p.write_bytes(original)
        raise ValueError(f"{os.fspath(path)}: edit rolled back, file unchanged: {err}") from err
    return f"{os.fspath(path)}: " + "; ".join(changes)
