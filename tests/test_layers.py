"""The import layers: ``vigil`` is the ground, ``vigil_shell`` the top, and the packages in
between (collector, slo, alerts, dashboard, serving, serve) import each other without a
cycle.

Every import of every module counts, those inside functions and under ``TYPE_CHECKING`` too,
and ``importlib.import_module("...")`` with a literal name.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GROUND = "vigil"
SHELL = "vigil_shell"
ROOMS = ("collector", "slo", "alerts", "dashboard", "serving", "serve")
PACKAGES = (GROUND, SHELL, *ROOMS)

Edge = tuple[str, str, int, str]  # (importing module, file, line, imported module)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, dotted module)`` for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield node.lineno, target
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


@cache
def edges() -> tuple[Edge, ...]:
    """Every import from one of our packages into another (or the same)."""
    out: list[Edge] = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for line, target in _imports(path):
                if target.partition(".")[0] in PACKAGES:
                    out.append((_module_name(path), str(path.relative_to(REPO)), line, target))
    return tuple(out)


def _top(module: str) -> str:
    return module.partition(".")[0]


def _where(found: list[Edge]) -> str:
    return "\n".join(f"  {file}:{line}: {module} imports {target}"
                     for module, file, line, target in found)


def test_every_package_is_seen() -> None:
    importers = {_top(e[0]) for e in edges()}
    assert set(PACKAGES) <= importers, set(PACKAGES) - importers


def test_the_ground_imports_no_other_package() -> None:
    found = [e for e in edges() if _top(e[0]) == GROUND and _top(e[3]) != GROUND]
    assert not found, "vigil (the ground) must import none of our packages:\n" + _where(found)


def test_no_package_imports_the_shell() -> None:
    found = [e for e in edges() if _top(e[0]) != SHELL and _top(e[3]) == SHELL]
    assert not found, "only vigil_shell may import vigil_shell:\n" + _where(found)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_cycle_finder() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"a"}}) == ["a", "a"]


def test_the_packages_between_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {room: set() for room in ROOMS}
    why: dict[tuple[str, str], list[Edge]] = {}
    for e in edges():
        src, dst = _top(e[0]), _top(e[3])
        if src in ROOMS and dst in ROOMS and src != dst:
            graph[src].add(dst)
            why.setdefault((src, dst), []).append(e)
    cycle = _cycle(graph)
    if cycle:
        steps = [f"{a} -> {b}:\n{_where(why[(a, b)])}" for a, b in itertools.pairwise(cycle)]
        message = "import cycle " + " -> ".join(cycle) + "\n" + "\n".join(steps)
        print(message)
        raise AssertionError(message)


# --- inside the rooms --------------------------------------------------------------------------
#: The subpackages of ``slo`` in layer order: each imports only those before it (and the
#: ground). ``slo.status``, at the top, composes them all.
SLO_LAYERS = ("promql", "sources", "objectives", "cost", "scaling", "planning", "backtest")
SLO_TOP = ("slo", "slo.status")


def _slo_layer(module: str) -> int:
    """The index of ``module`` in SLO_LAYERS (``len`` for the top); -1 outside ``slo``."""
    if _top(module) != "slo":
        return -1
    if module in SLO_TOP:
        return len(SLO_LAYERS)
    sub = module.split(".")[1]
    assert sub in SLO_LAYERS, f"{module} is in no layer of slo: add it to SLO_LAYERS"
    return SLO_LAYERS.index(sub)


def test_every_slo_module_sits_in_a_layer() -> None:
    modules = {e[0] for e in edges() if _top(e[0]) == "slo"}
    for module in modules:
        _slo_layer(module)
    assert {m.split(".")[1] for m in modules if m not in SLO_TOP} == set(SLO_LAYERS)


def test_slo_subpackages_import_only_the_layers_below() -> None:
    found = [e for e in edges() if _top(e[0]) == "slo" and _top(e[3]) == "slo"
             and _slo_layer(e[3]) > _slo_layer(e[0])]
    assert not found, ("slo's layers are " + " < ".join(SLO_LAYERS) + " < status; an import "
                       "goes up:\n" + _where(found))


def _in_rule_generator(module: str) -> bool:
    return module == "alerts.rules" or module.startswith("alerts.rules.")


def test_the_rule_generator_and_the_alerting_runtime_do_not_import_each_other() -> None:
    """``alerts.rules`` writes files from the specs; the runtime (``alerts.*`` else) sends
    notifications. Neither needs the other, and each stays small enough to read alone."""
    found = [e for e in edges() if _top(e[0]) == "alerts" and _top(e[3]) == "alerts"
             and e[0] != "alerts" and e[3] != "alerts"
             and _in_rule_generator(e[0]) != _in_rule_generator(e[3])]
    assert not found, ("alerts.rules (the generator) and the alerting runtime import each "
                       "other:\n" + _where(found))


def test_the_readme_layout_table_lists_every_package_folder_once() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)/` \|", section, re.M)
    folders = sorted(str(init.parent.relative_to(REPO)) for package in PACKAGES
                     for init in (REPO / package).rglob("__init__.py"))
    assert len(rows) == len(set(rows)), f"a folder has two rows: {rows}"
    assert sorted(rows) == folders, {"no row": sorted(set(folders) - set(rows)),
                                     "no such package": sorted(set(rows) - set(folders))}


def test_test_modules_share_code_through_support_only() -> None:
    """What tests share lives in ``tests/support/``: a test module imported by another would be
    collected twice in different workers and couples tests that have nothing in common."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for line, target in _imports(path):
            if target.rpartition(".")[2].startswith("test_"):
                found.append(f"  {path.relative_to(REPO)}:{line}: imports {target}")
    assert not found, "import from tests/support/ instead:\n" + "\n".join(found)


def test_command_line_code_lives_in_the_shell() -> None:
    """One module per command under ``vigil_shell/``: no room parses arguments."""
    found = []
    for room in ROOMS:
        for path in sorted((REPO / room).rglob("*.py")):
            for line, target in _imports(path):
                if target in ("argparse", "vigil_shell.options"):
                    found.append(f"  {path.relative_to(REPO)}:{line}: imports {target}")
    assert not found, "move the command to vigil_shell/:\n" + "\n".join(found)


def test_every_command_is_a_shell_module_with_its_options_and_run() -> None:
    from vigil_shell.cli import COMMANDS, SLO_STATUS

    for name, _, module in [*COMMANDS, ("slo status", "", SLO_STATUS)]:
        assert module.startswith("vigil_shell."), (name, module)
        path = REPO / (module.replace(".", "/") + ".py")
        assert path.exists(), (name, path)
        tree = ast.parse(path.read_text())
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"add_arguments", "run"} <= functions, (name, module)
