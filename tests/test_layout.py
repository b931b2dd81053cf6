"""The house: data flows one way. Every import between the harness's own modules, at module level or inside a
function (a lazy import is still a dependency) or under ``TYPE_CHECKING``, forms a graph; it must have no
cycle. ``graphlib.TopologicalSorter`` (standard library) raises ``CycleError`` naming one."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def import_graph(package: Path = ROOT / "harness") -> dict[str, set[str]]:
    """``{module: {harness modules it imports}}`` for every ``.py`` under ``package`` (absolute imports; the
    harness uses no relative ones, which the test checks too)."""
    mods = {}
    for p in package.rglob("*.py"):
        parts = p.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{p}: relative import"
                targets = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {t for t in targets if t in mods and t != m}
    return graph


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["harness.ablate"] >= {"harness.report", "harness.ablation_spec"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_cycle_check_catches_a_cycle():
    """The check is not vacuous: a graph with a two-module circle is refused."""
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())


def test_every_module_is_at_most_500_lines_and_named_in_the_readme_layout():
    """The README's layout section names every module under ``harness/`` (by its path below ``harness/``, or by
    its file name in the row of its package) and every template; none is over 500 lines."""
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("### Layout"):text.index("### The offline RLHF setting")]
    missing, long = [], []
    for p in sorted((ROOT / "harness").rglob("*")):
        if p.suffix not in (".py", ".j2") or p.name == "__init__.py" or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(ROOT / "harness").as_posix()
        if f"`{rel}`" not in layout and f"`{p.name}`" not in layout:
            missing.append(rel)
        if p.suffix == ".py" and len(p.read_text().splitlines()) > 500:
            long.append(rel)
    assert missing == [] and long == []
    for package in ("components/", "tasks/review_sentiment/", "pipeline/", "templates/"):
        assert f"`{package}`" in layout


def test_no_function_is_over_80_lines():
    """Outside tests, every function (docstring included) fits in 80 lines."""
    long = []
    for p in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{p.relative_to(ROOT)}:{node.name}")
    assert long == []
