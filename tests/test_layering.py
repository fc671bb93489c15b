"""docs/ARCHITECTURE.md's layering, enforced on the source: the "Import rules" table (which part of the
package may import which, which may import Lightning, which calls it never makes) is read from the
document itself, so the two cannot disagree; and no chain of imports leads from a module back to itself.

Imports are read with ``ast`` (nothing of the package is imported): ``import a.b``, ``from a import b``
(``a.b`` when it is a module, else ``a``), relative imports resolved against the file's package. The
rules count every import, also one inside a function. The cycle check counts every import that can run:
at module level, inside a function (a deferred import runs when the function is called: a circle through
one is a circle) and in an ``if __name__ == "__main__":`` block; not those under ``if TYPE_CHECKING:``,
which never run. Importing ``a.b.c`` runs the packages ``a.b`` on the way; ``__main__.py`` scripts are
run, never imported, so nothing reaches them.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lit_constrained"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
LIGHTNING = frozenset({"lightning", "pytorch_lightning", "lightning_fabric"})

#: Import cycles (deferred imports counted) allowed for now, each with why and who removes it. A cycle
#: passes only if all of its modules lie in one entry (patterns as in the table). No xfail: the test
#: passes with them, and fails on any other.
CYCLES_BEING_REMOVED: dict[tuple[str, ...], str] = {}


@dataclass(frozen=True)
class Rule:
    """One row of the "Import rules" table."""

    members: tuple[str, ...]  # the row's modules (path patterns under lit_constrained/)
    allowed: tuple[str, ...]  # what they may import from lit_constrained ("*": anything)
    lightning: bool
    never_calls: tuple[str, ...]  # method or function names, e.g. "step", "manual_backward"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module's path under lit_constrained/, e.g. "optim/sqp.py"
    line: int
    name: str  # the imported module, dotted
    at_module_level: bool
    runs: bool = True  # False under ``if TYPE_CHECKING:`` (never executed)


def _ticked(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def read_rules(text: str) -> list[Rule]:
    """The rows of the first table under ``## Import rules`` in ``text``."""
    section = text.split("\n## Import rules", 1)
    assert len(section) == 2, "docs/ARCHITECTURE.md has no '## Import rules' section"
    lines = section[1].split("\n## ", 1)[0].splitlines()
    rows = [line for line in lines if line.startswith("|")]
    assert len(rows) > 2, "the '## Import rules' section has no table"
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["package", "may import from lit_constrained", "Lightning", "never calls"], header
    rules = []
    for row in rows[2:]:
        package, allowed, lightning, never = (cell.strip() for cell in row.strip().strip("|").split("|"))
        assert lightning in ("yes", "no"), f"Lightning must be yes or no in the row {row!r}"
        calls = tuple(name.lstrip(".").removesuffix("()") for name in _ticked(never))
        rules.append(Rule(_ticked(package), _ticked(allowed), lightning == "yes", calls))
    return rules


def _matches(path: str, pattern: str) -> bool:
    """Whether the module at ``path`` (e.g. ``optim/sqp.py``, ``optim/__init__.py``) is ``pattern``:
    ``x/`` every module of package x, ``x/__init__.py`` the package itself, else a glob of the path."""
    if pattern == "*":
        return True
    return fnmatch.fnmatchcase(path, pattern + "*" if pattern.endswith("/") else pattern)


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["lit_constrained", *path.relative_to(PACKAGE).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _is_script_entry(node: ast.If) -> bool:
    return "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test)


def read_imports(path: Path) -> list[Import]:
    """Every import statement of the package's file at ``path``, resolved to module names."""
    return imports_of(path.read_text(), _relative(path))


def imports_of(source: str, relative: str) -> list[Import]:
    """Every import statement of ``source``, the module at ``lit_constrained/<relative>``."""
    parts = ["lit_constrained", *Path(relative).with_suffix("").parts]
    package = ".".join(parts[:-1])
    found: list[Import] = []

    def resolve(node: ast.ImportFrom) -> list[str]:
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join([*parts, *([base] if base else [])])
        names = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
        return names if len(names) == len(node.names) else [base, *names]

    def visit(node: ast.AST, at_module_level: bool, runs: bool) -> None:
        for child in ast.iter_child_nodes(node):
            level, executed = at_module_level, runs
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                level = False
            elif isinstance(child, ast.If) and (_is_type_checking(child) or _is_script_entry(child)):
                level, executed = False, executed and not _is_type_checking(child)
            if isinstance(child, ast.Import):
                found.extend(Import(relative, child.lineno, alias.name, level, executed) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                found.extend(Import(relative, child.lineno, target, level, executed) for target in resolve(child))
            visit(child, level, executed)

    visit(ast.parse(source, filename=relative), True, True)
    return found


RULES = read_rules(ARCHITECTURE.read_text())
IMPORTS = {name: read_imports(path) for name, path in MODULES.items()}


def _rule_of(path: str) -> Rule:
    rows = [rule for rule in RULES if any(_matches(path, member) for member in rule.members)]
    assert len(rows) == 1, (
        f"lit_constrained/{path} matches {len(rows)} rows of docs/ARCHITECTURE.md's 'Import rules' table "
        "(it must match exactly one): add it to the row of its layer"
    )
    return rows[0]


def _path_of(module: str) -> str:
    return _relative(MODULES[module])


def test_the_table_reads_as_the_rules_it_states() -> None:
    # the rules the document states in words, checked on the table the other tests read
    optim = _rule_of("optim/sqp.py")
    assert not optim.lightning and set(optim.allowed) == {"hints.py", "jacobians/"}  # hints.py: a module, not a package
    jacobians = _rule_of("jacobians/batched.py")  # below optim/: J's columns and the Jacobians, the hints' text only
    assert not jacobians.lightning and set(jacobians.allowed) == {"hints.py"}
    assert _rule_of("hints.py").allowed == () and not _rule_of("hints.py").lightning  # the bottom: imports none
    # the command line's console answers before Lightning is imported; its fit/ runs it
    assert not _rule_of("cli/console.py").lightning
    assert _rule_of("cli/fit/command.py").lightning
    assert not _rule_of("metrics/functional.py").lightning
    for path in ("callbacks/summary.py", "metrics/functional.py"):
        assert not any(_matches("tasks/spring.py", pattern) for pattern in _rule_of(path).allowed), path
        assert not any(_matches("module.py", pattern) for pattern in _rule_of(path).allowed), path
    tasks = _rule_of("tasks/spring.py")
    assert not any(_matches("optim/constrained.py", pattern) for pattern in tasks.allowed)  # the step's internals
    assert any(_matches("jacobians/pointwise.py", pattern) for pattern in tasks.allowed)  # the Jacobians: theirs
    assert {"step", "backward"} <= set(tasks.never_calls) and {"step", "backward"} <= set(_rule_of("callbacks/log10.py").never_calls)


def test_every_module_is_in_one_row() -> None:
    for path in MODULES.values():
        _rule_of(_relative(path))


def import_violations(relative: str, imports: list[Import]) -> list[str]:
    """The imports of the module at ``lit_constrained/<relative>`` that its row does not allow."""
    rule = _rule_of(relative)
    offenders = []
    for found in imports:
        top = found.name.split(".")[0]
        if top in LIGHTNING and not rule.lightning:
            offenders.append(f"lit_constrained/{relative}:{found.line} imports {found.name} (its row: no Lightning)")
        if top != "lit_constrained" or found.name not in MODULES:
            continue
        target = _path_of(found.name)
        if not any(_matches(target, pattern) for pattern in (*rule.members, *rule.allowed)):
            offenders.append(f"lit_constrained/{relative}:{found.line} imports lit_constrained/{target}")
    return offenders


def call_violations(relative: str, source: str) -> list[str]:
    """The calls in ``source`` (the module at ``lit_constrained/<relative>``) its row says it never makes."""
    never = set(_rule_of(relative).never_calls)
    offenders = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in never:
                offenders.append(f"lit_constrained/{relative}:{node.lineno} calls {called}()")
    return offenders


def test_each_package_imports_only_what_its_row_allows() -> None:
    offenders = [line for module, imports in IMPORTS.items() for line in import_violations(_path_of(module), imports)]
    assert not offenders, "imports docs/ARCHITECTURE.md's 'Import rules' do not allow:\n" + "\n".join(offenders)


def test_tasks_and_callbacks_never_step() -> None:
    offenders = [line for path in MODULES.values() for line in call_violations(_relative(path), path.read_text())]
    assert not offenders, "calls docs/ARCHITECTURE.md's 'Import rules' forbid:\n" + "\n".join(offenders)


@pytest.mark.parametrize("relative,source,expected", [
    ("optim/sqp.py", "def f():\n    import lightning.pytorch as pl\n", ["optim/sqp.py:2 imports lightning.pytorch"]),
    ("optim/sqp.py", "from ..callbacks import log10\n", ["optim/sqp.py:1 imports lit_constrained/callbacks/log10.py"]),
    ("optim/sqp.py", "from .. import hints\nfrom .checks import check_objective\n", []),
    ("callbacks/log10.py", "import lit_constrained.tasks.spring\n", ["callbacks/log10.py:1 imports lit_constrained/tasks/spring.py"]),
    ("callbacks/summary.py", "from lit_constrained.module import ConstrainedModule\n", ["callbacks/summary.py:1 imports lit_constrained/module.py"]),
    ("metrics/functional.py", "from lightning.pytorch.callbacks import Callback\n", ["metrics/functional.py:1 imports lightning.pytorch.callbacks"]),
    ("tasks/spring.py", "from lit_constrained.optim.constrained import ConstrainedOptimizer\n", ["tasks/spring.py:1 imports lit_constrained/optim/constrained.py"]),
    ("tasks/spring.py", "from lit_constrained.optim import SQPAdam\nfrom ..jacobians import per_sample_jacobian\n", []),
])
def test_the_import_check_finds_what_a_row_forbids(relative: str, source: str, expected: list[str]) -> None:
    # hand-written sources placed in the package: what the check must report, and what it must let pass
    found = import_violations(relative, imports_of(source, relative))
    assert [line.split(" (")[0].removeprefix("lit_constrained/") for line in found] == expected


def test_the_call_check_finds_a_step_in_a_task() -> None:
    source = "class T:\n    def training_step(self, batch):\n        self.optimizers().step()\n        self.manual_backward(1)\n"
    assert call_violations("tasks/spring.py", source) == [
        "lit_constrained/tasks/spring.py:3 calls step()", "lit_constrained/tasks/spring.py:4 calls manual_backward()",
    ]
    assert call_violations("module.py", source) == []  # the module steps: that is its job


def import_graph(imports_by_module: dict[str, list[Import]], deferred: bool = True) -> dict[str, set[str]]:
    """module -> the package modules it may import: every import that can run (with ``deferred``, those
    inside functions and ``__main__`` blocks too; never those under ``if TYPE_CHECKING:``) and the
    packages each runs on the way. ``__main__.py`` scripts are left out: nothing imports them."""
    graph: dict[str, set[str]] = {}
    for module, imports in imports_by_module.items():
        if module.endswith(".__main__"):
            continue
        targets = set()
        for found in imports:
            if not found.runs or (not deferred and not found.at_module_level) or found.name not in MODULES:
                continue
            parts = found.name.split(".")
            for end in range(2, len(parts) + 1):  # a.b.c runs a.b first (the root's __init__ imports nothing)
                target = ".".join(parts[:end])
                # a module's own packages are already being imported when it runs: not an edge
                if target in MODULES and target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph`` as its strongly connected components of two modules or more (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_cycle_detection_finds_a_cycle_and_only_cycles() -> None:
    # a hand-made graph: a -> b -> c -> a is one cycle, d -> a hangs off it, e -> e is no edge here
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_the_cycle_check_counts_imports_inside_functions() -> None:
    # hand-written sources: hints.py importing the module inside a function, the module importing hints
    # at module level: a circle (the function's import runs when it is called); under TYPE_CHECKING: none
    deferred = {"lit_constrained.hints": imports_of("def f():\n    from lit_constrained.module import X\n", "hints.py"),
                "lit_constrained.module": imports_of("from .hints import add_hint\n", "module.py")}
    assert strongly_connected(import_graph(deferred)) == [["lit_constrained.hints", "lit_constrained.module"]]
    assert strongly_connected(import_graph(deferred, deferred=False)) == []
    typing_only = {**deferred, "lit_constrained.hints": imports_of(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lit_constrained.module import X\n", "hints.py")}
    assert strongly_connected(import_graph(typing_only)) == []


def test_hints_import_nothing_of_the_package() -> None:
    # the bottom of the house: every layer (the optimizers too) may import hints.py, so it imports none
    assert [f"line {i.line}: {i.name}" for i in IMPORTS["lit_constrained.hints"]
            if i.name.split(".")[0] == "lit_constrained"] == []


def test_no_import_cycle() -> None:
    cycles = []
    for component in strongly_connected(import_graph(IMPORTS)):
        paths = [_path_of(module) for module in component]
        allowed = [why for patterns, why in CYCLES_BEING_REMOVED.items()
                   if all(any(_matches(path, pattern) for pattern in patterns) for path in paths)]
        if not allowed:
            cycles.append(" <-> ".join(f"lit_constrained/{path}" for path in paths))
    assert not cycles, ("import cycles, imports inside functions counted (move what both need to a lower "
                        "module):\n" + "\n".join(cycles))

