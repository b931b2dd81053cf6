"""The house: data flows one way. Every import between the harness's own modules, at module level or inside a
function (a lazy import is still a dependency) or under ``TYPE_CHECKING``, forms a graph; it must have no
cycle. ``graphlib.TopologicalSorter`` (standard library) raises ``CycleError`` naming one."""

from __future__ import annotations

import ast
import graphlib
import re
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
    assert len(graph) > 40 and graph["harness.experiments.ablate"] >= {"harness.reporting.ablation", "harness.experiments.spec"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_cycle_check_catches_a_cycle():
    """The check is not vacuous: a graph with a two-module circle is refused."""
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())


def test_every_module_is_at_most_500_lines_and_named_in_the_layout_page():
    """``docs/layout.md`` names every module under ``harness/`` (by its path below ``harness/``, or by its file name
    in the row of its package) and every template; none is over 500 lines."""
    layout = (ROOT / "docs" / "layout.md").read_text()
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
    packages = sorted(p.parent.name for p in (ROOT / "harness").rglob("__init__.py") if p.parent != ROOT / "harness")
    assert len(packages) >= 10 and [pkg for pkg in packages if f"{pkg}/`" not in layout] == []


#: The top of ``harness/``: the command line, the config package, the registries and the errors; everything else
#: sits in the package of its layer.
TOP_LEVEL = {"__init__.py", "cli.py", "registry.py", "errors.py", "config"}


def test_the_top_of_the_package_holds_only_the_front():
    """Only the CLI, config, registry and errors sit at the top of ``harness/``; every layer is a package."""
    top = {p.name for p in (ROOT / "harness").iterdir() if p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir())}
    layers = {"rl", "tasks", "pipeline", "infra", "experiments", "analysis", "reporting", "bench"}
    assert top - layers == TOP_LEVEL and layers <= top


def test_the_readme_is_a_front_door():
    """The README stays short (at most 150 lines), keeps the two set-up commands and links every page of ``docs/``."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make setup && make ablate NAME=kl_placement" in text and "make test" in text
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 8 and [p for p in pages if f"(docs/{p})" not in text] == []


def test_the_readme_quotes_the_committed_scorecard():
    """The README's count of claims and decided findings is the committed scorecard's, number for number."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    card = (ROOT / "reports" / "README.md").read_text()
    claims = re.search(r"^(\d+) claims:", card, re.M).group(1)
    decided, findings = re.search(r"Findings decided [^:]*: (\d+) of (\d+)", card).groups()
    quoted = re.search(r"(\d+) claims, of which (\d+) of the (\d+) findings are decided", readme)
    assert quoted is not None, "the README no longer quotes the scorecard's counts"
    assert quoted.groups() == (claims, decided, findings)


def test_no_function_is_over_80_lines():
    """Outside tests, every function (docstring included) fits in 80 lines."""
    long = []
    for p in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{p.relative_to(ROOT)}:{node.name}")
    assert long == []
