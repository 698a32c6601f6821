"""`write_plan`: what a capacity plan decides, written into an existing cluster.yaml, nothing else.

A round-trip YAML library (ruamel.yaml) reads the file into a tree that remembers every comment,
flow style and column, so the dump changes only the values set here (capacity/plan_settings.py):

    engine.{max_num_seqs, min_num_seqs, max_num_batched_tokens, max_model_len,
            block_size_tokens, gpu_memory_utilization, kv_cache_bytes}
    pools.hot.num_replicas, pools.cold.max_replicas (and cold.initial_replicas, clamped into
            [min_replicas, max_replicas])
    controller.replica_capacity_rps (only where the app has a `controller:` section: adding one
            would switch the controller on)

A key that is missing is added at the end of its section. The application is the one named
`app_name`, or else the only application that is not an embedding app. Anchors, aliases and merge
keys in an edited section are refused (an edit there would change another section too). The new
text is validated with `serving.config.load_cluster_yaml` and compared with the old one as data
(nothing but the owned keys may differ) before it atomically replaces the file; on any error the
file is untouched and ValueError names the reason.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from capacity.plan_settings import PlanSettings

ENGINE_KEYS = (
    "max_num_seqs",
    "min_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size_tokens",
    "gpu_memory_utilization",
    "kv_cache_bytes",
)
OWNED_PATHS = frozenset(
    [("engine", k) for k in ENGINE_KEYS]
    + [
        ("pools", "hot", "num_replicas"),
        ("pools", "cold", "max_replicas"),
        ("pools", "cold", "initial_replicas"),
        ("controller", "replica_capacity_rps"),
    ]
)
_GIB = 1024**3


def _yaml():
    from ruamel.yaml import YAML

    y = YAML()  # round trip
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap a long line
    y.indent(mapping=2, sequence=4, offset=2)  # cluster.yaml's own layout
    y.representer.add_representer(
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return y


def _find_app(doc: Any, app_name: str | None) -> tuple[str, Any]:
    apps = doc.get("applications") if isinstance(doc, Mapping) else None
    if not isinstance(apps, list):
        raise ValueError("not a Ray Serve config file (no 'applications' list)")
    if app_name is not None:
        for app in apps:
            if isinstance(app, Mapping) and app.get("name") == app_name:
                return app_name, app
        names = [a.get("name") for a in apps if isinstance(a, Mapping)]
        raise ValueError(f"no application named {app_name!r}; found {names}")
    llm = [a for a in apps if isinstance(a, Mapping) and not _is_embed(a)]
    if len(llm) != 1:
        names = [a.get("name") for a in llm]
        raise ValueError(
            f"{len(llm)} LLM applications ({names}); name the one to write with --app NAME"
        )
    return llm[0].get("name"), llm[0]


def _is_embed(app: Mapping) -> bool:
    model = (app.get("args") or {}).get("model") or {}
    return isinstance(model, Mapping) and model.get("task") == "embed"


def _section(parent: Any, key: str, path: str, create: bool = True, shared_ok: bool = False) -> Any:
    """The mapping at parent[key], created (block style) when absent; refuses shared nodes
    unless shared_ok."""
    from ruamel.yaml.comments import CommentedMap

    node = parent.get(key)
    if node is None:
        if not create:
            return None
        node = CommentedMap()
        _set(parent, key, node)
    if not isinstance(node, CommentedMap):
        raise ValueError(f"{path} must be a mapping, got {node!r}")
    anchor = getattr(node, "anchor", None)
    if (anchor is not None and anchor.value and not shared_ok) or getattr(node, "merge", None):
        raise ValueError(f"{path} uses a YAML anchor, alias or merge key; edit it by hand")
    return node


def _set(cmap: Any, key: str, value: Any) -> None:
    """Set cmap[key]; a new key goes last, and the blank or comment lines that followed the old
    last key move below it (they introduce whatever comes next in the file)."""
    if key in cmap or not cmap:
        cmap[key] = value
        return
    from ruamel.yaml.tokens import CommentToken

    last = list(cmap)[-1]
    cmap[key] = value
    slots = cmap.ca.items.get(last)
    token = slots[2] if slots and len(slots) > 2 else None
    if isinstance(token, CommentToken) and "\n" in token.value.rstrip("\n") + "\n":
        head, sep, tail = token.value.partition("\n")
        if tail:
            token.value = head + sep
            mark = token.start_mark
            cmap.ca.items[key] = [None, None, CommentToken("\n" + tail, mark, None), None]


def _reword_comment(cmap: Any, key: str, text: str) -> None:
    """Replace the text of key's end-of-line comment, keeping its column and the lines after."""
    from ruamel.yaml.tokens import CommentToken

    slots = cmap.ca.items.get(key)
    token = slots[2] if slots and len(slots) > 2 else None
    if isinstance(token, CommentToken) and token.value.startswith("#"):
        _, sep, tail = token.value.partition("\n")
        token.value = f"# {text}{sep}{tail}"


def _changes(cfg_before: dict, cfg_after: dict) -> list[str]:
    out = []
    for path in sorted(OWNED_PATHS):
        old, new = _get(cfg_before, path), _get(cfg_after, path)
        if old != new:
            out.append(f"{'.'.join(path)}: {old} -> {new}")
    return out


def _get(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(data, Mapping) or part not in data:
            return None
        data = data[part]
    return data


def _strip_owned(data: Any, path: tuple[str, ...] = ()) -> Any:
    """The data without the owned keys (and without sections only they filled)."""
    if isinstance(data, Mapping):
        out = {k: _strip_owned(v, (*path, k)) for k, v in data.items()}
        return {
            k: v
            for k, v in out.items()
            if (*path, k) not in OWNED_PATHS and not (v == {} and data[k] != {})
        }
    if isinstance(data, list):
        return [_strip_owned(v, path) for v in data]
    return data


def _apply(args: Any, s: PlanSettings) -> str | None:
    """Set the owned values in the app's `args`; returns a note on what was not written."""
    engine = _section(args, "engine", "engine")
    for key, value in s.engine_values().items():
        _set(engine, key, value)
    if s.kv_cache_bytes is None:
        comment = "null: sized from device memory after weights + warm-up (GPU)"
    else:
        comment = f"{s.kv_cache_bytes / _GIB:.2f} GiB of KV cache per replica (capacity plan)"
    _reword_comment(engine, "kv_cache_bytes", comment)  # its old comment spelled the old size
    pools = _section(args, "pools", "pools")
    hot, cold = _section(pools, "hot", "pools.hot"), _section(pools, "cold", "pools.cold")
    _set(hot, "num_replicas", s.hot_replicas)
    cold_min = cold.get("min_replicas", 0)
    if not isinstance(cold_min, int) or s.cold_max_replicas < cold_min:
        raise ValueError(
            f"cold_max_replicas={s.cold_max_replicas} is below pools.cold.min_replicas="
            f"{cold_min}; lower min_replicas first"
        )
    _set(cold, "max_replicas", s.cold_max_replicas)
    init = cold.get("initial_replicas", 1)
    if isinstance(init, int) and not cold_min <= init <= s.cold_max_replicas:
        _set(cold, "initial_replicas", min(max(init, cold_min), s.cold_max_replicas))
    controller = _section(args, "controller", "controller", create=False)
    if controller is None:
        return (
            "controller.replica_capacity_rps not written (no controller section; adding one "
            f"would turn the controller on): planned {s.replica_capacity_rps} req/s per replica"
        )
    _set(controller, "replica_capacity_rps", s.replica_capacity_rps)
    return None


def render_plan(text: str, settings: PlanSettings, app_name: str | None = None):
    """(new text, app name, note or None) with the plan's values set; ValueError if unrecognised."""
    from ruamel.yaml import YAMLError

    y = _yaml()
    try:
        doc = y.load(text)
    except YAMLError as err:
        raise ValueError(f"not valid YAML: {err}") from None
    name, app = _find_app(doc, app_name)
    args = app.get("args")
    if args is None:
        raise ValueError(f"application {name!r} has no `args:` section")
    # cluster.yaml anchors `args` for the app's autoscaling_policy (policy_kwargs.app_args is
    # an alias of it): editing args in place edits the policy's copy too, as it should.
    note = _apply(_section(app, "args", "args", shared_ok=True), settings)
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue(), name, note


def write_plan(path: str | os.PathLike, settings: PlanSettings, app_name: str | None = None) -> str:
    """Write the plan's values into the cluster.yaml at `path`; returns a summary of changes."""
    import yaml

    from serving.config import load_cluster_yaml

    if settings.hot_replicas < 1:
        raise ValueError(f"hot_replicas={settings.hot_replicas} must be >= 1")
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    new_text, name, note = render_plan(text, settings, app_name)
    before, after = yaml.safe_load(text), yaml.safe_load(new_text)
    apps = {a.get("name"): a.get("args") for a in after["applications"]}
    old_apps = {a.get("name"): a.get("args") for a in before["applications"]}
    if _strip_owned(old_apps[name]) != _strip_owned(apps[name]) or [
        a for a in before["applications"] if a.get("name") != name
    ] != [a for a in after["applications"] if a.get("name") != name]:
        raise ValueError("the edit changed keys it does not own; file untouched")
    changes = _changes(old_apps[name] or {}, apps[name] or {})
    suffix = f"; {note}" if note else ""
    if not changes:
        return f"{os.fspath(path)}: no change{suffix}"
    fd, tmp = tempfile.mkstemp(prefix=".plan-", suffix=".yaml", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new_text)
        try:
            load_cluster_yaml(tmp, name)
        except ValueError as err:
            raise ValueError(f"{os.fspath(path)}: not written, file unchanged: {err}") from None
        shutil.copymode(p, tmp)
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return f"{os.fspath(path)}: " + "; ".join(changes) + suffix
