"""rlinf/'s packages form layers: a module imports only from packages in lower layers (never
sideways into another package of its own layer, never up), no two modules import each other through
any chain, and no backend imports another backend. Every import counts, also those inside
functions and under TYPE_CHECKING: a lazy import is still a dependency."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlinf.workers.backends import ACTOR_BACKENDS, REWARD_WORKER, ROLLOUT_BACKENDS

RLINF = Path(__file__).resolve().parents[2] / "rlinf"

# Top to bottom. Command-line tools (python -m rlinf.export_hf) use the runners' code; the runner
# drives role facades (scheduler), which start workers; workers run models with algorithms and
# checkpoint them (utils); at the bottom, packages that need nothing else of rlinf: the typed
# config, data and RolloutBatch, the math grader, weight transfer.
LAYERS = (
    ("export_hf",),
    ("runners",),
    ("scheduler",),
    ("workers",),
    ("utils",),
    ("algorithms", "models"),
    ("config", "data", "rewards", "weight_sync"),
)

BACKENDS = {
    path.split(":")[0] for path in (*ACTOR_BACKENDS.values(), *ROLLOUT_BACKENDS.values(), REWARD_WORKER)
}

# Arrows the layers forbid that are still in the tree, each with who removes it. Empty is the goal.
ALLOWED: set[tuple[str, str]] = set()


def modules(root: Path = RLINF) -> dict[str, Path]:
    """Dotted name -> file of every module under `root` (an `rlinf` folder)."""
    named = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        named[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return named


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The rlinf modules `path` imports (the package, where an import names no module of it)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            source = ".".join(part for part in (base, node.module) if part)
            targets = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def import_graph(root: Path = RLINF) -> dict[str, set[str]]:
    known = modules(root)
    return {name: set(imported_modules(name, path, known)) for name, path in known.items()}


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the module's package (None for the root `rlinf` package itself)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for index, packages in enumerate(LAYERS):
        if parts[1] in packages:
            return index
    raise AssertionError(f"{module}: package rlinf.{parts[1]} is in no layer of {__name__}.LAYERS")


def forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
    """One line per import that goes up or sideways between packages, or from backend to backend."""
    problems = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if (source, target) in ALLOWED:
                continue
            upper, lower = layer_of(source), layer_of(target)
            if upper is None or lower is None:
                continue
            same_package = source.split(".")[1] == target.split(".")[1]
            if lower < upper:
                problems.append(f"{source} imports {target}: up from layer {upper} to {lower}")
            elif lower == upper and not same_package:
                problems.append(f"{source} imports {target}: sideways within layer {LAYERS[upper]}")
            elif source in BACKENDS and target in BACKENDS:
                problems.append(f"{source} imports {target}: one backend depends on another")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_every_import_goes_down_the_layers():
    problems = forbidden_arrows(import_graph())
    assert not problems, "\n".join(problems)


def test_no_modules_import_each_other():
    found = cycles(import_graph())
    assert not found, "\n".join(" <-> ".join(group) for group in found)


def test_every_allowed_exception_is_still_needed():
    graph = import_graph()
    assert [arrow for arrow in sorted(ALLOWED) if arrow[1] not in graph.get(arrow[0], set())] == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "rlinf" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "rlinf"


def test_the_checks_see_up_sideways_lazy_relative_and_backend_imports_and_cycles(tmp_path, monkeypatch):
    root = _write(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "",
            "config/schema.py": "def f():\n    from rlinf.runners.main import run\n",
            "data/__init__.py": "",
            "data/batch.py": "from rlinf.rewards import grader\n",
            "rewards/__init__.py": "",
            "rewards/grader.py": "",
            "models/__init__.py": "",
            "models/a.py": "from . import b\n",
            "models/b.py": "import rlinf.models.a\n",
            "runners/__init__.py": "",
            "runners/main.py": "from rlinf.models.a import y\nfrom rlinf.workers import one\n",
            "workers/__init__.py": "",
            "workers/one.py": "from rlinf.workers.two import Two\n",
            "workers/two.py": "",
        },
    )
    monkeypatch.setattr(sys.modules[__name__], "BACKENDS", {"rlinf.workers.one", "rlinf.workers.two"})
    graph = import_graph(root)
    assert graph["rlinf.config.schema"] == {"rlinf.runners.main"}
    assert graph["rlinf.runners.main"] == {"rlinf.models.a", "rlinf.workers.one"}
    assert forbidden_arrows(graph) == [
        "rlinf.config.schema imports rlinf.runners.main: up from layer 6 to 1",
        "rlinf.data.batch imports rlinf.rewards.grader: sideways within layer "
        "('config', 'data', 'rewards', 'weight_sync')",
        "rlinf.workers.one imports rlinf.workers.two: one backend depends on another",
    ]
    assert cycles(graph) == [["rlinf.models.a", "rlinf.models.b"]]


def test_a_package_outside_the_layers_is_named(tmp_path):
    root = _write(
        tmp_path, {"__init__.py": "", "extras/__init__.py": "", "extras/x.py": "import rlinf.data\n"}
    )
    with pytest.raises(AssertionError, match="rlinf.extras is in no layer"):
        forbidden_arrows(import_graph(root))
