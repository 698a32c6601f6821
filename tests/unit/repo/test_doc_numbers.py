"""The numbers README.md and docs/ quote match the result files they name
(scripts/check_doc_numbers.py).

The checker itself is tested on small pages and files written here: a number that does not round
to its file's value, a key that is not there, a missing file and a bad table all fail."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location(
    "check_doc_numbers", ROOT / "scripts" / "check_doc_numbers.py"
)
check = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = check  # dataclasses look their module up there
spec.loader.exec_module(check)

RESULT = {
    "ratios": {"a_vs_b": 2.8946},
    "fraction": 0.0456,
    "systems": [{"name": "engine", "tps": 179.45, "p50": 0.2626}, {"name": "peer", "tps": 133.79}],
    "runs": {"1x": {"p50_s": 0.09, "p99_s": 0.61}},
    "reach": {"99.9%": 1.38},
}


def page_problems(tmp_path: Path, text: str) -> tuple[int, list]:
    (tmp_path / "r.json").write_text(json.dumps(RESULT))
    page = tmp_path / "page.md"
    page.write_text(text)
    return check.check_page(page, results=tmp_path)


def test_the_docs_quote_their_result_files_exactly():
    checked, problems = 0, []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        n, bad = check.check_page(page)
        checked, problems = checked + n, problems + bad
    assert problems == [], "\n".join(map(str, problems))
    n_bench, _ = check.check_page(ROOT / "docs" / "benchmarks.md")
    assert n_bench >= 100  # benchmarks.md is annotated, not just free of annotations


def test_a_changed_number_in_benchmarks_md_fails(tmp_path):
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    quoted = "**2.89x**<!-- engine_throughput_cpu_quick.json: ratios.tideserve_vs_static_batch -->"
    assert quoted in text
    page = tmp_path / "benchmarks.md"
    page.write_text(text.replace(quoted, quoted.replace("2.89x", "2.99x"), 1), encoding="utf-8")
    _, problems = check.check_page(page)
    assert [p.shown for p in problems] == ["2.99"], problems


@pytest.mark.parametrize(
    "line",
    [
        "tideserve **2.89x**<!-- r.json: ratios.a_vs_b --> the peer",
        "share 4.6%<!-- r.json: {fraction} * 100 -->",
        "engine 179.4 tok/s<!-- r.json: systems.engine.tps -->",
        "ratio 1.34x<!-- r.json: {systems.engine.tps} / {systems.peer.tps} -->",
        "p50 **0.09 s**<!-- r.json: runs.1x.p50_s -->, p99 0.61<!-- r.json: runs.1x.p99_s -->",
        "2.9x<!-- r.json: ratios.a_vs_b -->",  # fewer decimals shown, looser check
        "99.9% at 1.38x<!-- r.json: reach.99.9% -->",  # a key with a dot in it
    ],
)
def test_a_number_that_rounds_to_its_file_passes(tmp_path, line):
    n, problems = page_problems(tmp_path, line + "\n")
    assert n >= 1 and problems == []


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("tideserve **2.88x**<!-- r.json: ratios.a_vs_b -->", "the file says 2.8946"),
        ("share 4.5%<!-- r.json: {fraction} * 100 -->", "the file says 4.56"),
        ("engine 179 tok/s<!-- r.json: systems.peer.tps -->", "the file says 133.79"),
        ("x 2.89<!-- r.json: ratios.a_vs_c -->", "no key 'a_vs_c'"),
        ("x 2.89<!-- r.json: systems.gpu.tps -->", "no single item named 'gpu'"),
        ("x 2.89<!-- gone.json: ratios.a_vs_b -->", "no such file"),
        ("x 2.89<!-- r.json: {ratios.a_vs_b} ** 2 -->", "not an arithmetic expression"),
        ("the ratio<!-- r.json: ratios.a_vs_b -->", "no number right before"),
    ],
)
def test_a_number_that_does_not_match_its_file_fails(tmp_path, line, why):
    _, problems = page_problems(tmp_path, line + "\n")
    assert len(problems) == 1 and why in problems[0].why, problems


TABLE = """\
<!-- table r.json: systems.{row}.{col}; cols: tps p50 -->
| system | tokens/s | TTFT p50 s |
|---|---:|---:|
| `engine` (in-process) | 179.4 | 0.26 |
| `peer` | 133.8 | - |
"""


def test_a_table_is_checked_cell_by_cell(tmp_path):
    n, problems = page_problems(tmp_path, TABLE.replace("| - |", "| n/a |"))
    assert problems[0].why.startswith("malformed") if problems else n == 0  # peer has no p50
    rows = TABLE.replace("cols: tps p50", "cols: tps -")
    n, problems = page_problems(tmp_path, rows)
    assert (n, problems) == (2, [])
    wrong = rows.replace("133.8", "139.8")
    _, problems = page_problems(tmp_path, wrong)
    assert [p.line for p in problems] == [5] and "133.79" in problems[0].why


def test_table_rows_may_be_named_and_cells_may_hold_two_numbers(tmp_path):
    table = """\
<!-- table r.json: runs.{row}.{col}; rows: 1x; cols: p50_s/p99_s -->
| load | TTFT p50 / p99 |
|---|---|
| one times capacity | 0.09 / **0.61 s** |
"""
    assert page_problems(tmp_path, table) == (2, [])
    _, problems = page_problems(tmp_path, table.replace("0.61", "0.71"))
    assert len(problems) == 1 and problems[0].shown == "0.71"
