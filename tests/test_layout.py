"""The package's shape: one level of layers, no import cycles, no upward imports, a torch-free core.

The import graph is read from the source with ``ast`` (imports inside functions and
under ``TYPE_CHECKING`` included), so a cycle hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lifecycle"

LAYERS = (
    "journal",
    "_core",
    "_liveness",
    "_torch",
    "checkpoint",
    "_training",
    "restart",
    "_launch",
    "_tools",
    "testing",
)
"""Bottom-up: a module may import its own layer and the ones before it, never a later one.

``journal`` (public: a file format any tool may read) is the lowest: it imports no other
layer, so the core, the training loop and ``show`` all use it and it needs none of them.
``_liveness`` (the rank's monitor process and its marks, standard library only) is a
feature above the core: the core never imports it (``Session.progress`` calls the
session's ``progress_sink``, a seam the core declares, which ``pretrain`` sets to the
rank's marks); ``_torch`` (a failure notice waits for the monitor's verdict) and
``_training`` (which starts the monitor) use it. ``_launch`` (starting processes that die
with their starter) sits below the two that launch ranks, the demo and ``lifecycle.testing``."""

PRODUCTS = "_tools"
"""The one layer whose modules sit a level deeper, in a folder per product (``_tools/demo/``, ``_tools/show/``)."""

HEAVY = ("torch", "megatron", "nvidia_resiliency_ext")
"""What ``_core`` must not import, and ``import lifecycle`` must not load."""


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` under the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, name: str, known: set[str]) -> Iterator[str]:
    """Every module the source at ``path`` imports, anywhere in it; ``lifecycle`` names resolved to modules."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield candidate if candidate in known else base


def graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports."""
    mods = modules()
    known = set(mods)
    return {name: {dep for dep in imported(path, name, known) if dep in known} for name, path in mods.items()}


def layer(name: str) -> int:
    """The layer index of a module; the top package (``lifecycle``, ``lifecycle.__main__``) sits above all."""
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return len(LAYERS)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated last), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            cycle = visit(dep)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(edges):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def test_the_layers_are_the_sub_packages_one_level_deep() -> None:
    """Every module sits in a layer sub-package (or is the top package), never deeper than one level.

    ``_tools`` alone holds a folder per product, and every one of its modules is in one."""
    for name, path in modules().items():
        parts = name.split(".")
        depth = 4 if parts[1:2] == [PRODUCTS] else 3
        assert len(parts) <= depth, f"{name} is nested deeper than one sub-package"
        if len(parts) == 3:
            assert parts[1] in LAYERS, f"{name} is in a sub-package that is not a layer"
            folder = path.name == "__init__.py"
            assert parts[1] != PRODUCTS or folder, f"{name} is a module of {PRODUCTS} outside a product folder"


def test_the_import_graph_has_no_cycle() -> None:
    """No module imports itself through others, at module level or inside a function."""
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_no_module_imports_a_later_layer() -> None:
    """Imports go down the layers, in the order of ``LAYERS``: never from a later one."""
    upward = [
        f"{name} (layer {LAYERS[layer(name)]}) imports {dep}"
        for name, deps in graph().items()
        for dep in deps
        if layer(name) < len(LAYERS) and layer(dep) > layer(name)
    ]
    assert upward == []


def test_the_core_imports_no_torch_megatron_or_nvrx_and_transitions_only_in_its_adapter() -> None:
    """``_core`` and ``journal`` are pure: no heavy import in them; ``transitions`` only in ``_core/machine``."""
    mods = modules()
    known = set(mods)
    offences = []
    for name, path in mods.items():
        roots = {dep.split(".")[0] for dep in imported(path, name, known)}
        if name.startswith(("lifecycle._core", "lifecycle.journal")):
            offences += [f"{name} imports {root}" for root in sorted(roots & set(HEAVY))]
        if "transitions" in roots and name != "lifecycle._core.machine":
            offences.append(f"{name} imports transitions (only lifecycle._core.machine may)")
        if "nvidia_resiliency_ext" in roots and not name.startswith("lifecycle.restart"):
            offences.append(f"{name} imports NVRx (only lifecycle.restart may)")
    assert offences == []


def test_the_journal_imports_only_the_standard_library_and_itself() -> None:
    """``lifecycle.journal`` is a file format anyone may read: its modules import the standard library and it alone."""
    mods = modules()
    known = set(mods)
    offences = [
        f"{name} imports {dep}"
        for name, path in mods.items()
        if name.startswith("lifecycle.journal")
        for dep in imported(path, name, known)
        if not dep.startswith("lifecycle.journal")
        and dep.split(".")[0] not in sys.stdlib_module_names
        and dep != "__future__"
    ]
    assert offences == []


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    """The graph checks can fail: a two-module cycle is found, and so is an import from a later layer."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer("lifecycle._core.session") < layer("lifecycle._training.pretrain")


@pytest.mark.parametrize(
    "module", ["lifecycle", "lifecycle.lowlevel", "lifecycle.journal", "lifecycle._tools.cli.main", "lifecycle.testing"]
)
def test_importing_the_package_loads_no_torch(module: str) -> None:
    """In a fresh interpreter, importing ``module`` leaves torch, megatron-core and NVRx out of ``sys.modules``."""
    code = (
        f"import sys, {module}\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"import {module} loaded {done.stdout.strip()} {done.stderr[-500:]}"


MAX_MODULE_LINES = 600
"""The longest a module of the package may be (issue 24: code a newcomer can read in one sitting)."""


def test_no_module_is_longer_than_the_limit() -> None:
    """Every module of lifecycle/ has at most MAX_MODULE_LINES lines (writer.py had grown to 637 unnoticed)."""
    long = {
        str(path.relative_to(PACKAGE)): count
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long
