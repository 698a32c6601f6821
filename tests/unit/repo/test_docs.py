"""The documentation points at things that exist: requirements and decisions the code cites, files
and links the pages name. A renamed module or a new requirement number fails here, not in a
reader's hands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".json"}
NUM_REQUIREMENTS, NUM_DECISIONS = 10, 11


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    paths = [ROOT / line for line in out.splitlines()]
    return [p for p in paths if p.suffix in TEXT_SUFFIXES and p.is_file()]


def test_requirements_and_decisions_are_numbered_as_the_code_cites_them():
    requirements = (DOCS / "requirements.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## R(\d+) ", requirements, flags=re.M)
    assert headings == [str(n) for n in range(1, NUM_REQUIREMENTS + 1)]
    design = (DOCS / "design.md").read_text(encoding="utf-8")
    decisions = re.findall(r"^(\d+)\. \*\*", design, flags=re.M)
    assert decisions == [str(n) for n in range(1, NUM_DECISIONS + 1)]


def test_every_citation_resolves():
    bad = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT)
        for n in re.findall(r"\bR(\d{1,2})\b", text):
            if not 1 <= int(n) <= NUM_REQUIREMENTS:
                bad.append(f"{rel}: R{n}")
        for n in re.findall(r"\b[Dd]ecisions? (\d+)\b", text):
            if not 1 <= int(n) <= NUM_DECISIONS:
                bad.append(f"{rel}: decision {n}")
    assert not bad, bad


# Words that point outside the repository or at how it was written, not at what it does.
FOREIGN = re.compile(
    r"\bMISSION\b|\bDESIGN\b|\b[Ii]ssue \d+|this session|same-session|\bhelper engineer"
)


def test_no_citation_points_outside_the_repository():
    hits = []
    for path in tracked_text_files():
        if path == Path(__file__):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
            if FOREIGN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()[:80]}")
    assert not hits, hits


TOP = "serving|capacity|autoscaling|common|tideserve|benchmarks|tests|examples|scripts|docs"
REPO_PATH = re.compile(rf"`((?:{TOP})/[\w./-]*)(?:(?::|::)[\w.]+)?`")
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)]*))?\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_paths_and_links_in_the_docs_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = [p for p in REPO_PATH.findall(text) if not (ROOT / p.rstrip("/")).exists()]
    for link, anchor in LINK.findall(text):
        target = page.parent / link if link else page
        if "://" in link:
            continue
        if not target.exists():
            missing.append(link)
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            missing.append(f"{link}#{anchor}")
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"
