"""The package's layering: imports between subpackages point one way, with no circles.

Read statically from every `import` in the source (a function-local import is an arrow too: it only
hides the circle until that function runs). A top-level module (`objtrain/io.py`) counts as a unit of
its own, like a subpackage.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import objtrain

PACKAGE = Path(objtrain.__file__).parent

# Back-edges still in the tree, owned by the code on their left. Each is named so that no new circle
# can hide behind it, and the test fails once one is gone, so that the entry is removed with it. None is
# left: the end-of-run sample, the last arrow from training up into evaluation, is passed in by the CLI.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str | None:
    """`objtrain.data.tables` -> `data`; `objtrain.io` -> `io`; the root package itself -> None."""
    parts = module.split(".")
    if parts[0] != "objtrain" or len(parts) < 2 or parts[1] == "__main__":
        return None
    return parts[1]


def _is_unit(package: Path, name: str) -> bool:
    return (package / f"{name}.py").is_file() or (package / name).is_dir()


def import_edges(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the `file:line` places that import across."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        source = _unit(module)
        if source is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    package_parts = module.split(".") if is_init else module.split(".")[:-1]
                    kept = package_parts[: len(package_parts) - node.level + 1]
                    base = ".".join([*kept, base] if base else kept)
                if base == "objtrain":  # `from objtrain import io` names a unit; `import IGNORE` does not
                    targets = [f"objtrain.{a.name}" for a in node.names if _is_unit(package, a.name)]
                else:
                    targets = [base]
            for target in targets:
                unit = _unit(target)
                if unit is not None and unit != source:
                    edges[(source, unit)].append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return dict(edges)


def find_cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    """One circle of units (`[a, b, a]`), or None when the graph is acyclic."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(edges):
        graph[a].append(b)
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_sees_a_circle_and_a_clean_graph() -> None:
    assert find_cycle({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"), ("b", "c"), ("a", "c")}) is None


def test_import_edges_reads_function_local_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "objtrain"
    (package / "data").mkdir(parents=True)
    (package / "interop").mkdir()
    (package / "__init__.py").write_text("IGNORE = -100\n")
    (package / "errors.py").write_text("")
    (package / "data" / "__init__.py").write_text("")
    (package / "data" / "sources.py").write_text("def f():\n    from objtrain.interop import tables\n")
    (package / "interop" / "__init__.py").write_text("")
    (package / "interop" / "tables.py").write_text("from ..data import sources\nfrom ..errors import E\n")
    edges = import_edges(package)
    assert edges[("data", "interop")] == ["objtrain/data/sources.py:2"]
    assert edges[("interop", "data")] == ["objtrain/interop/tables.py:1"]
    assert ("interop", "errors") in edges
    assert find_cycle(set(edges)) in (["data", "interop", "data"], ["interop", "data", "interop"])


def test_subpackages_import_without_circles() -> None:
    edges = import_edges()
    cycle = find_cycle(set(edges) - set(KNOWN_BACK_EDGES))
    if cycle:
        steps = [f"{a} -> {b} ({', '.join(edges[(a, b)][:3])})" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("import circle: " + "; ".join(steps))
    gone = [f"{a} -> {b}" for a, b in KNOWN_BACK_EDGES if (a, b) not in edges]
    assert not gone, f"no longer imported, remove from KNOWN_BACK_EDGES: {gone}"


def test_the_data_layer_imports_no_interop() -> None:
    """Reading corpora and tokenizers is below export and init-from."""
    edges = import_edges()
    assert ("data", "interop") not in edges, edges.get(("data", "interop"))
