"""Check the numbers the docs quote against the result files they name.

    python scripts/check_doc_numbers.py                 # docs/*.md; exit 1 on any mismatch
    python scripts/check_doc_numbers.py docs/benchmarks.md

The convention (documented at the top of docs/benchmarks.md). A number quoted from a committed
result file in benchmarks/results/ is followed by an HTML comment, invisible once rendered, that
names the file and where in it the number is:

    **2.89x**<!-- engine_throughput_cpu_quick.json: ratios.tideserve_vs_static_batch -->
    p50 0.107 s<!-- hardening.json: isolation.loaded.interactive.ttft_p50_s -->
    4.6%<!-- engine_throughput_cpu_quick.json: {outside_forward_fraction} * 100 -->

The reference is a dotted key path (a list is indexed by position, or by the `name` of the
object in it; a key with dots in it, such as `99.9%`, is written as it is) or an arithmetic
expression (+ - * / and parentheses) of key paths in braces. The number checked is the one right
before the comment; a unit (`x`, `s`, `%`, `tok/s`, ...) and the closing `**` of bold may sit
between. The file's value must round to the number as shown: 2.89
accepts [2.885, 2.895]. A table is checked cell by cell by one comment on the line before it:

    <!-- table engine_throughput_cpu.json: systems.{row}.{col}; cols: tokens_per_s - ttft_p50_s -->

`{row}` is each data row's first cell (its first `code` span if it has one) or, with
`rows: a b c`, the given keys in order; `{col}` is the key given for each column after the
first, `-` for a column not checked; `a/b` for a cell that shows two numbers (`0.09 / 0.61 s`),
`key*100` or `key*1000` for a cell in percent or milliseconds.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

ANNOTATION = re.compile(r"<!--\s*(?P<file>[\w.\-]+\.json)\s*:\s*(?P<ref>.*?)\s*-->")
TABLE = re.compile(r"^<!--\s*table\s+(?P<file>[\w.\-]+\.json)\s*:\s*(?P<spec>.*?)\s*-->\s*$")
# The number right before an annotation: a unit word or symbol and closing bold may follow it.
NUMBER_BEFORE = re.compile(r"(?P<num>[-−]?\d+(?:\.\d+)?)[  ]?[A-Za-z%×/]*[*`]*\s*$")
NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


@dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    shown: str
    file: str
    ref: str
    why: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.shown} <- {self.file}: {self.ref}: {self.why}"


@dataclass(frozen=True)
class Check:
    """One quoted number and where it should come from."""

    line: int
    shown: str
    file: str
    ref: str


def lookup(data, path: str):
    """The value at a dotted key path; a list takes an index or the `name` of an item. A key
    that holds dots itself (`99.9%`) is matched whole: the longest run of segments that is a key."""
    node, keys = data, path.split(".")
    while keys:
        if isinstance(node, dict):
            n = next((n for n in range(len(keys), 0, -1) if ".".join(keys[:n]) in node), 0)
            if not n:
                raise KeyError(f"no key {keys[0]!r} (has {sorted(node)[:12]})")
            node, keys = node[".".join(keys[:n])], keys[n:]
            continue
        key, keys = keys[0], keys[1:]
        if isinstance(node, list):
            if key.lstrip("-").isdigit():
                node = node[int(key)]
                continue
            named = [x for x in node if isinstance(x, dict) and x.get("name") == key]
            if len(named) != 1:
                raise KeyError(f"no single item named {key!r} in a list of {len(node)}")
            node = named[0]
        else:
            raise KeyError(f"{key!r}: {type(node).__name__} has no keys")
    return node


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KeyError(f"{where} is {value!r}, not a number")
    return float(value)


def evaluate(data, ref: str) -> float:
    """A key path, or an arithmetic expression of {key.paths}."""
    if "{" not in ref:
        return _number(lookup(data, ref), ref)
    values: dict[str, float] = {}

    def name(match: re.Match) -> str:
        var = f"v{len(values)}"
        values[var] = _number(lookup(data, match.group(1).strip()), match.group(1))
        return var

    tree = ast.parse(re.sub(r"\{([^}]*)\}", name, ref), mode="eval")

    def run(node) -> float:
        if isinstance(node, ast.Expression):
            return run(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](run(node.left), run(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -run(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        raise KeyError(f"not an arithmetic expression of key paths: {ref!r}")

    return run(tree)


def matches(shown: str, value: float) -> bool:
    """Whether value rounds to the number as shown (its decimals)."""
    text = shown.replace("−", "-")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(value - float(text)) <= 0.5 * 10**-decimals * (1 + 1e-9) + 1e-12


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row_key(cell: str) -> str:
    code = re.search(r"`([^`]+)`", cell)
    return code.group(1) if code else cell.strip("* ")


def _cell_ref(template: str, row: str, key: str) -> str:
    """A column key may carry a scale, `error*100` or `p99_s*1000`, for a unit the page shows."""
    scaled = re.fullmatch(r"(.+?)([*/])([\d.]+)", key)
    if not scaled:
        return template.format(row=row, col=key)
    path = template.format(row=row, col=scaled[1])
    return f"{{{path}}} {scaled[2]} {scaled[3]}"


def table_checks(lines: list[str], start: int, file: str, spec: str) -> list[Check]:
    """The checks of the table after line `start` (0-based) under one `table` comment."""
    parts = dict(p.split(":", 1) if ":" in p else ("path", p) for p in spec.split(";"))
    parts = {k.strip(): v.strip() for k, v in parts.items()}
    template, cols = parts["path"], parts["cols"].split()
    rows = parts["rows"].split() if "rows" in parts else None
    i = start + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    body = []
    for j in range(i + 2, len(lines)):  # past the header and the |---| line
        if not lines[j].lstrip().startswith("|"):
            break
        body.append(j)
    if rows is not None and len(rows) != len(body):
        raise ValueError(f"line {start + 1}: {len(rows)} row keys for {len(body)} table rows")
    checks = []
    for n, j in enumerate(body):
        cells = _cells(lines[j])
        row = rows[n] if rows is not None else _row_key(cells[0])
        if len(cells) - 1 != len(cols):
            raise ValueError(f"line {j + 1}: {len(cells) - 1} cells for {len(cols)} column keys")
        for cell, col in zip(cells[1:], cols, strict=True):
            if col == "-":
                continue
            keys, numbers = col.split("/"), NUMBER.findall(cell)
            if len(keys) != len(numbers):
                raise ValueError(f"line {j + 1}: cell {cell!r} has {len(numbers)} numbers, {col}")
            for key, shown in zip(keys, numbers, strict=True):
                if key != "-":
                    checks.append(Check(j + 1, shown, file, _cell_ref(template, row, key)))
    return checks


def collect(text: str) -> list[Check]:
    """Every quoted number of a page with its reference, in page order."""
    lines = text.splitlines()
    checks: list[Check] = []
    for i, line in enumerate(lines):
        table = TABLE.match(line.strip())
        if table:
            checks += table_checks(lines, i, table["file"], table["spec"])
            continue
        for m in ANNOTATION.finditer(line):
            before = ANNOTATION.sub("", line[: m.start()])
            number = NUMBER_BEFORE.search(before)
            shown = number["num"] if number else ""
            checks.append(Check(i + 1, shown, m["file"], m["ref"]))
    return checks


def check_page(path: Path, results: Path = RESULTS) -> tuple[int, list[Problem]]:
    """(numbers checked, problems) of one page."""
    text = path.read_text(encoding="utf-8")
    try:
        checks = collect(text)
    except (ValueError, KeyError) as err:
        return 0, [Problem(path.name, 0, "", "", "", f"malformed table comment: {err}")]
    problems, loaded = [], {}
    for c in checks:

        def problem(why: str, c=c) -> Problem:
            return Problem(path.name, c.line, c.shown, c.file, c.ref, why)

        if not c.shown:
            problems.append(problem("no number right before the comment"))
            continue
        if c.file not in loaded:
            f = results / c.file
            loaded[c.file] = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else None
        if loaded[c.file] is None:
            problems.append(problem(f"no such file in {results}"))
            continue
        try:
            value = evaluate(loaded[c.file], c.ref)
        except (KeyError, IndexError, ZeroDivisionError, SyntaxError) as err:
            problems.append(problem(f"cannot read it: {err}"))
            continue
        if not matches(c.shown, value):
            problems.append(problem(f"the file says {value:.6g}"))
    return len(checks), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="default: README.md and docs/*.md")
    args = parser.parse_args(argv)
    pages = args.pages or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    total, bad = 0, []
    for page in pages:
        n, problems = check_page(page)
        total += n
        bad += problems
    for p in bad:
        print(p)
    print(f"{total} quoted numbers checked in {len(pages)} pages; {len(bad)} do not match")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
