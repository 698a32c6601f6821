"""Write docs/configuration.md from the config classes, so the reference cannot drift from the code.

    python scripts/gen_config_reference.py            # (re)write docs/configuration.md
    python scripts/gen_config_reference.py --check    # exit 1 if the committed file is stale

Every key comes from the dataclasses behind `AppConfig` (serving/config/ and EngineConfig),
walked from AppConfig's fields, so a new field appears by itself. For each key:
- type and default: the field's annotation and default;
- allowed: recorded from the class's own validation. `__post_init__` is re-run with
  `check_range` / `check_choice` / `check_order` replaced by recorders, so the ranges shown are
  the ones enforced. A bound that moves with another field (min_num_seqs <= max_num_seqs) is found
  by setting that field to a marker value and watching the bound follow it;
- description: the comment block right above the field and the comment at the end of its line,
  the comments a reader of the class sees. A field without one is an error here.
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import io
import sys
import tokenize
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.config import AppConfig, LeadOverride, TierConfig  # noqa: E402
from serving.config.sections import DEFAULT_TIERS, TIER_NAMES  # noqa: E402

OUT = ROOT / "docs" / "configuration.md"
MARKER = 987654  # a value no default or bound uses: where it shows up, a bound follows a field
# Classes without defaults for every field: the instance whose checks are recorded.
SAMPLES: dict[type, Any] = {
    TierConfig: DEFAULT_TIERS["interactive"],
    LeadOverride: LeadOverride(start="11:30", end="12:30", lead_s=1200.0),
}


@dataclass
class Key:
    name: str
    type: str
    default: str
    allowed: list[str] = field(default_factory=list)
    description: str = ""


# ----- descriptions: the comments next to each field ---------------------------------------------


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> its leading comment block plus its end-of-line comment, as one sentence."""
    path = inspect.getsourcefile(cls)
    source = Path(path).read_text(encoding="utf-8")
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.line.strip() != tok.string.strip():
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    node = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    out = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above, i = [], stmt.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        after = [trailing[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in trailing]
        words = " ".join(above + after).replace("noqa: E731", "").strip()
        out[stmt.target.id] = words
    return out


# ----- allowed values: recorded from the class's own checks --------------------------------------


def _recorders(log: list[tuple]) -> dict[str, Any]:
    def check_range(owner, name, value, lo=None, hi=None, *, lo_open=False, integer=False):
        log.append(("range", name, lo, hi, lo_open))

    def check_choice(owner, name, value, allowed):
        log.append(("choice", name, tuple(allowed)))

    def check_order(owner, *named):
        log.append(("order", tuple(n for n, _ in named)))

    return {"check_range": check_range, "check_choice": check_choice, "check_order": check_order}


def record_checks(instance: Any) -> list[tuple]:
    """Run instance.__post_init__ with the validators recording instead of raising."""
    module = sys.modules[type(instance).__module__]
    log: list[tuple] = []
    saved = {}
    for name, fn in _recorders(log).items():
        if name in vars(module):
            saved[name] = vars(module)[name]
            setattr(module, name, fn)
    try:
        instance.__post_init__()
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)
    return log


def _base_name(checked: str) -> str:
    # "bucket_edges_tokens[0]" and "resources.pool_hot" check parts of one field.
    return checked.split("[")[0].split(".")[0]


def _numeric(hint: Any) -> type | None:
    args = typing.get_args(hint) if _is_union(hint) else (hint,)
    return next((t for t in (int, float) if t in args and bool not in args), None)


def _with(instance: Any, name: str, value: Any) -> Any:
    other = copy.copy(instance)
    object.__setattr__(other, name, value)
    return other


def _interval(entry: tuple, follows: dict[tuple[str, str], str], name: str) -> str:
    """[lo, hi], (lo, hi], [lo, ∞) ...; a bound that follows another field shows its name."""
    _, _, lo, hi, lo_open = entry
    lo_text = follows.get((name, "lo")) or ("-∞" if lo is None else f"{lo:g}")
    hi_text = follows.get((name, "hi")) or ("∞" if hi is None else f"{hi:g}")
    left = "(" if lo_open or lo is None else "["
    return f"{left}{lo_text}, {hi_text}{')' if hi is None else ']'}"


def allowed_values(cls: type, instance: Any, hints: dict[str, Any]) -> dict[str, list[str]]:
    names = [f.name for f in fields(cls)]
    numeric = {n: _numeric(hints[n]) for n in names if _numeric(hints[n])}
    probe = instance
    for n, kind in numeric.items():  # optional numbers: give them a value so their check runs
        if getattr(instance, n) is None:
            probe = _with(probe, n, kind(MARKER + 1))
    follows: dict[tuple[str, str], str] = {}
    for g, kind in numeric.items():
        for entry in record_checks(_with(probe, g, kind(MARKER))):
            if entry[0] == "range" and _base_name(entry[1]) != g:
                for side, bound in (("lo", entry[2]), ("hi", entry[3])):
                    if bound == MARKER:
                        follows[(_base_name(entry[1]), side)] = g
    out: dict[str, list[str]] = {n: [] for n in names}
    for entry in record_checks(probe):
        if entry[0] == "range" and _base_name(entry[1]) in out:
            n = _base_name(entry[1])
            text = _interval(entry, follows, n)
            _add(out[n], text if entry[1] == n else f"each {text}")
        elif entry[0] == "choice" and entry[1] in out:
            _add(out[entry[1]], "one of " + ", ".join(f"`{c}`" for c in entry[2]))
        elif entry[0] == "order":
            for n in entry[1]:
                if n in out:
                    _add(out[n], " ≤ ".join(entry[1]))
    return out


def _add(items: list[str], text: str) -> None:
    if text not in items:
        items.append(text)


# ----- types and defaults ------------------------------------------------------------------------


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def type_name(hint: Any) -> str:
    if _is_union(hint):
        parts = [type_name(a) for a in typing.get_args(hint) if a is not type(None)]
        nullable = type(None) in typing.get_args(hint)
        return " or ".join(parts) + (" or null" if nullable else "")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "string"
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if origin is not None and issubclass(origin, Mapping):
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if is_dataclass(hint):
        return "mapping: " + ", ".join(f.name for f in fields(hint))
    return {str: "string", int: "integer", float: "number", bool: "bool"}.get(hint, str(hint))


def yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return f"{value}"


def default_of(f) -> str:
    if f.default is not MISSING:
        return yaml_value(f.default)
    if f.default_factory is not MISSING:
        return yaml_value(f.default_factory())
    return "required"


# ----- the sections under `args` -----------------------------------------------------------------


def section_keys(cls: type, instance: Any) -> list[Key]:
    hints = typing.get_type_hints(cls)
    comments, allowed = field_comments(cls), allowed_values(cls, instance, hints)
    keys = []
    for f in fields(cls):
        hint = hints[f.name]
        allow = allowed[f.name] or (["true, false"] if hint is bool else [])
        keys.append(Key(f.name, type_name(hint), default_of(f), allow, comments[f.name]))
    return keys


@dataclass
class Section:
    path: str
    cls: type
    keys: list[Key]
    note: str = ""


def _unwrap(hint: Any) -> Any:
    if _is_union(hint):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def sections() -> list[Section]:
    """Every dataclass reachable from AppConfig's fields, in field order, by YAML path."""
    out: list[Section] = []
    for f in fields(AppConfig):
        hint = _unwrap(typing.get_type_hints(AppConfig)[f.name])
        if typing.get_origin(hint) is not None and issubclass(typing.get_origin(hint), Mapping):
            cls = typing.get_args(hint)[1]  # tiers: name -> TierConfig
            keys = section_keys(cls, SAMPLES[cls])
            for key in keys:
                key.default = " / ".join(
                    yaml_value(getattr(DEFAULT_TIERS[t], key.name)) for t in TIER_NAMES
                )
            note = f"One mapping per tier: {', '.join(TIER_NAMES)}; defaults in that order."
            out.append(Section(f"{f.name}.<tier>", cls, keys, note))
        else:
            out += _dataclass_sections(f.name, hint)
    return out


def _dataclass_sections(path: str, cls: type) -> list[Section]:
    hints = typing.get_type_hints(cls)
    nested = {f.name: hints[f.name] for f in fields(cls) if is_dataclass(hints[f.name])}
    if nested and len(nested) == len(fields(cls)):  # a grouping such as `pools`
        return [s for n, sub in nested.items() for s in _dataclass_sections(f"{path}.{n}", sub)]
    out = [Section(path, cls, section_keys(cls, SAMPLES.get(cls) or cls()))]
    for f in fields(cls):  # lists of sub-mappings, e.g. controller.lead_overrides
        args = typing.get_args(hints[f.name])
        if typing.get_origin(hints[f.name]) is tuple and args and is_dataclass(args[0]):
            item = args[0]
            out.append(Section(f"{path}.{f.name}[]", item, section_keys(item, SAMPLES[item])))
    return out


# ----- the page ----------------------------------------------------------------------------------

HEADER = """\
# Configuration reference

<!-- Generated by `python scripts/gen_config_reference.py` from the config classes; do not edit.
     tests/unit/config/test_reference_doc.py fails when this file is stale. -->

`cluster.yaml` is a Ray Serve config file (`serve run cluster.yaml`). Serve reads its top level
(`proxy_location`, `http_options`, and per application `name`, `route_prefix`, `import_path`);
each application's `args` is tideserve's own section, listed below. Serve would ignore a
misspelled key there; tideserve does not: `AppConfig.from_args` (serving/config/app_config.py)
rejects unknown keys, wrong types and out-of-range values with an error that names the key path,
the value and what is allowed, and suggests the closest known key:

```
ValueError: engine.max_num_seqz=32 is not a known key; allowed keys: [...];
did you mean 'max_num_seqs'?
```

Leave a key out to keep its default. An LLM app (`model.task: generate`) refuses
`dynamic_batching`; an embedding app (`model.task: embed`) refuses `engine`, `tiers`,
`controller`, `batch_api` and `pools.cold`.
Hot and cold replicas are built from the same `model`, `engine`, `replica`, `tiers`, `server` and
`dynamic_batching` values (decision 3 in [design.md](design.md)), and the ingress checks their
fingerprint.

Two keys were renamed so that no two features share a name; the old key is an error that names
the new one: `batch:` is now `batch_api:` (OpenAI's Batch API, /v1/files and /v1/batches) and
`batching:` is now `dynamic_batching:` (how an embedding replica groups requests into one pass).

Allowed values: `[a, b]` includes both ends, `(a, b]` excludes `a`; a field name as a bound means
the bound is that field's value; `x ≤ y` means the named fields must ascend.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    parts = [HEADER]
    for section in sections():
        module = section.cls.__module__.replace(".", "/") + ".py"
        parts.append(f"\n## {section.path}\n\n`{section.cls.__name__}` in `{module}`.")
        doc = inspect.getdoc(section.cls)
        if doc and not doc.startswith(section.cls.__name__ + "("):
            parts.append(" " + " ".join(doc.split()))
        if section.note:
            parts.append(" " + section.note)
        missing = [k.name for k in section.keys if not k.description]
        if missing:
            raise SystemExit(
                f"{module}: {section.cls.__name__} fields {missing} have no comment; add one "
                "above the field or at the end of its line (it becomes the description)"
            )
        parts.append("\n\n| key | type | default | allowed | description |\n")
        parts.append("|---|---|---|---|---|\n")
        for k in section.keys:
            allowed = "; ".join(k.allowed)
            row = [f"`{k.name}`", k.type, f"`{k.default}`", allowed, k.description]
            parts.append("| " + " | ".join(_cell(c) for c in row) + " |\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/gen_config_reference.py")
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
