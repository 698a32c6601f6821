"""The import graph of serving/: the layering a reader may rely on, read from the source with ast.

A node is one of serving/'s folders (api, batch, config, embed, engine, llm, routes) or one of its
top-level modules (app, model_source, serve_status, ...). Every `import` and `from ... import` of
a file counts, wherever it stands (inside a function, under TYPE_CHECKING): a reader has to know
the module either way.

- No cycle between the nodes: each folder can be read knowing only the ones below it.
- serving/config is a leaf. From this repository it imports only common/ and leaf modules of
  serving/: modules that import nothing from serving/, in a folder that does not itself import
  config (no sibling above it). Today those are serving/model_source.py and
  serving/engine/config.py, the engine's own config. So every package may read its section from
  config, and config can never close a cycle.
- serving/batch (the Batch API's offline lane) imports nothing from serving/llm/ and no web
  framework: its HTTP routes are serving/routes/; it reaches the ingress through LaneHost.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REPO_PACKAGES = ("serving", "capacity", "autoscaling", "common", "tideserve", "benchmarks")
WEB_FRAMEWORKS = ("fastapi", "starlette")


@dataclass(frozen=True)
class Import:
    source: Path  # the importing file, relative to the root
    module: str  # the dotted module imported (a name imported from a module is that module)


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    rel = path.relative_to(root)
    package = _package_of(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(rel, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the file's package, `level - 1` packages up
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:  # `from pkg import mod` imports the module pkg.mod
                sub = f"{module}.{alias.name}"
                found.append(Import(rel, sub if _module_file(root, sub) else module))
    return found


def node_of(module_or_path: str) -> str | None:
    """serving.llm.ingress -> llm; serving.app -> app; None outside serving/."""
    parts = module_or_path.removesuffix(".py").replace("/", ".").split(".")
    if parts[0] != "serving" or len(parts) < 2 or parts[1] == "__init__":
        return None
    return parts[1]


def serving_imports(root: Path) -> list[Import]:
    return [i for path in sorted((root / "serving").rglob("*.py")) for i in imports_of(path, root)]


def folder_edges(root: Path) -> dict[tuple[str, str], Import]:
    """(from node, to node) -> one import that makes the edge (to name it in a failure)."""
    edges: dict[tuple[str, str], Import] = {}
    for imp in serving_imports(root):
        src, dst = node_of(str(imp.source)), node_of(imp.module)
        if src and dst and src != dst:
            edges.setdefault((src, dst), imp)
    return edges


def cycles(edges: dict[tuple[str, str], Import]) -> list[list[str]]:
    """Each strongly connected group of two or more nodes (Tarjan), sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst in edges:
        graph[src].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def _in_serving(imp: Import) -> bool:
    return imp.module == "serving" or imp.module.startswith("serving.")


def _imports_of_package(root: Path, node: str) -> list[Import]:
    return [i for i in serving_imports(root) if node_of(str(i.source)) == node]


def is_leaf_module(root: Path, module: str) -> bool:
    """A module that imports nothing from serving/ but itself."""
    path = _module_file(root, module)
    return path is not None and not any(
        _in_serving(i) and i.module != module for i in imports_of(path, root)
    )


def reaches(edges: dict[tuple[str, str], Import], start: str, goal: str) -> bool:
    """Whether `start` imports `goal`, directly or through other nodes."""
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += [dst for (src, dst) in edges if src == node]
    return False


def config_violations(root: Path) -> list[str]:
    bad, edges = [], folder_edges(root)
    for imp in _imports_of_package(root, "config"):
        top, node = imp.module.split(".")[0], node_of(imp.module)
        if _in_serving(imp):
            if node == "config":
                continue
            if node and reaches(edges, node, "config"):
                bad.append(f"{imp.source} imports {imp.module}, from {node}/ above config")
            elif not is_leaf_module(root, imp.module):
                bad.append(f"{imp.source} imports {imp.module}, which is not a leaf module")
        elif top in REPO_PACKAGES and top != "common":
            bad.append(f"{imp.source} imports {imp.module}; config may import only common/")
    return list(dict.fromkeys(bad))  # one line per import statement


def batch_violations(root: Path) -> list[str]:
    bad = []
    for imp in _imports_of_package(root, "batch"):
        if node_of(imp.module) == "llm":
            bad.append(f"{imp.source} imports {imp.module} (serving/llm/)")
        if imp.module.split(".")[0] in WEB_FRAMEWORKS:
            bad.append(f"{imp.source} imports {imp.module} (HTTP belongs in serving/routes/)")
    return list(dict.fromkeys(bad))


def _described(group: list[str], edges: dict[tuple[str, str], Import]) -> str:
    inside = [(s, d) for (s, d) in edges if s in group and d in group]
    return "; ".join(f"{s} -> {d} ({edges[s, d].source}: {edges[s, d].module})" for s, d in inside)


# ----- the rules, on this checkout ----------------------------------------------------------------


def test_no_folder_of_serving_imports_another_that_imports_it_back():
    edges = folder_edges(ROOT)
    found = cycles(edges)
    assert not found, "folder cycles in serving/: " + " | ".join(
        _described(g, edges) for g in found
    )


def test_config_is_a_leaf_that_imports_only_common_and_leaf_modules():
    assert config_violations(ROOT) == []
    # the two leaf modules it reads today are leaves indeed
    assert is_leaf_module(ROOT, "serving.model_source")
    assert is_leaf_module(ROOT, "serving.engine.config")


def test_the_batch_lane_imports_nothing_from_llm_and_holds_no_http():
    assert batch_violations(ROOT) == []


def test_routes_is_where_the_lane_meets_the_ingress():
    edges = folder_edges(ROOT)
    assert ("routes", "llm") in edges and ("routes", "batch") in edges
    assert not [src for (src, dst) in edges if dst == "routes" and src != "app"]


# ----- the reader itself: the rules can fail -------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "serving/__init__.py": "",
            "serving/config/__init__.py": "from serving.embed.batching import X\n",
            "serving/embed/__init__.py": "",
            "serving/embed/batching.py": "def f():\n    from serving.config import C\n",
        },
    )
    edges = folder_edges(root)
    assert cycles(edges) == [["config", "embed"]]
    assert edges["config", "embed"].source == Path("serving/config/__init__.py")


def test_config_importing_a_package_above_it_or_a_non_leaf_module_is_named(tmp_path):
    root = _tree(
        tmp_path,
        {
            "serving/__init__.py": "",
            "serving/config/__init__.py": "from serving.engine import config\nimport autoscaling\n",
            "serving/config/a.py": "from serving.batch.lane import Lane\n",
            "serving/config/b.py": "from serving.embed.batching import Section\n",
            "serving/embed/__init__.py": "",
            "serving/embed/batching.py": "",  # a leaf module, but in a folder above config
            "serving/embed/replica.py": "from serving.config import AppConfig\n",
            "serving/engine/__init__.py": "",
            "serving/engine/config.py": "from common.validate import check_range\n",
            "serving/batch/__init__.py": "",
            "serving/batch/lane.py": "from serving.llm import ingress\nimport fastapi\n",
            "serving/llm/__init__.py": "",
            "serving/llm/ingress.py": "",
        },
    )
    assert config_violations(root) == [
        "serving/config/__init__.py imports autoscaling; config may import only common/",
        "serving/config/a.py imports serving.batch.lane, which is not a leaf module",
        "serving/config/b.py imports serving.embed.batching, from embed/ above config",
    ]
    assert batch_violations(root) == [
        "serving/batch/lane.py imports serving.llm.ingress (serving/llm/)",
        "serving/batch/lane.py imports fastapi (HTTP belongs in serving/routes/)",
    ]
