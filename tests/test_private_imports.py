"""The suite reaches lifecycle's private modules through one door: tests/support's internals modules.

A private module is one with a component starting with ``_`` (``lifecycle._core.session``,
``lifecycle.journal._records``). A test of such a module imports it itself (listed in
``UNIT_TESTS``); any other test, worker or helper imports from ``support.internals`` (torch-free)
or ``support.torch_internals``, which list in one place what the suite uses behind the
public names (``lifecycle``, ``lifecycle.journal``, ``lifecycle.testing``,
``lifecycle.restart``, ``lifecycle.checkpoint``). Imports are read with ``ast``, those
inside functions included; one in a string (a script a test runs) is not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent

DOORS = ("support/internals.py", "support/torch_internals.py")
"""The modules through which the rest of the suite reaches private ones."""

UNIT_TESTS: dict[str, frozenset[str]] = {
    "training/test_decide.py": frozenset({"lifecycle._training.decide"}),
    "training/test_retry.py": frozenset({"lifecycle._training.retry"}),
    "training/test_saves.py": frozenset({"lifecycle._training.saves"}),
    "training/test_memory.py": frozenset({"lifecycle._training.memory"}),
    "training/test_memory_copy.py": frozenset({"lifecycle._training.copies", "lifecycle._training.memory"}),
    "core/test_bounds.py": frozenset({"lifecycle._core.bounds"}),
    "core/test_config_checks.py": frozenset({"lifecycle._core.errors"}),
    "core/test_frames.py": frozenset({"lifecycle._core.frames"}),
    "core/test_machine.py": frozenset({"lifecycle._core.machine", "lifecycle._core.table"}),
    "core/test_processes.py": frozenset({"lifecycle._core.processes"}),
    "core/test_signal_chain.py": frozenset({"lifecycle._core.signals"}),
    "distributed/test_agreement.py": frozenset({"lifecycle._torch.store"}),
    "distributed/test_failure_notice.py": frozenset({"lifecycle._torch.notice"}),
    "distributed/test_megatron_clean.py": frozenset({"lifecycle._torch.megatron"}),
    "distributed/test_nccl_settings.py": frozenset({"lifecycle._torch.config", "lifecycle._torch.megatron"}),
    "distributed/test_store_ops.py": frozenset({"lifecycle._torch.notice", "lifecycle._torch.store"}),
    "distributed/test_positions_gloo.py": frozenset({"lifecycle._liveness.collectives", "lifecycle._liveness.rank"}),
    "liveness/test_fault_kinds.py": frozenset({"lifecycle._liveness.monitor"}),
    "liveness/test_judgement.py": frozenset(
        {
            "lifecycle._liveness.judgement",
            "lifecycle._liveness.monitor",
            "lifecycle._liveness.rank",
            "lifecycle._liveness.settings",
        }
    ),
    "tools/test_show_collectives.py": frozenset({"lifecycle._tools.show.collectives"}),
    "liveness/test_positions.py": frozenset(
        {
            "lifecycle._liveness.monitor",
            "lifecycle._liveness.neighbour",
            "lifecycle._liveness.page",
            "lifecycle._liveness.rank",
            "lifecycle._liveness.settings",
            "lifecycle._liveness.summary",
        }
    ),
    "workers/positions_worker.py": frozenset(
        {"lifecycle._liveness.collectives", "lifecycle._liveness.page", "lifecycle._liveness.rank"}
    ),
    "liveness/test_monitor_load.py": frozenset(
        {"lifecycle._liveness.monitor", "lifecycle._liveness.rank", "lifecycle._liveness.settings"}
    ),
    "liveness/test_monitor_parts.py": frozenset(
        {"lifecycle._liveness.monitor", "lifecycle._liveness.rank", "lifecycle._liveness.settings"}
    ),
    "liveness/test_monitor_survival.py": frozenset(
        {
            "lifecycle._liveness.monitor",
            "lifecycle._liveness.page",
            "lifecycle._liveness.rank",
            "lifecycle._liveness.settings",
        }
    ),
    "journal/test_schema.py": frozenset({"lifecycle.journal._records", "lifecycle.journal._schema"}),
    "restart/test_nvml.py": frozenset({"lifecycle.restart._nvml"}),
    "tools/test_demo_options.py": frozenset({"lifecycle._tools.demo.main", "lifecycle._tools.demo.options"}),
    "tools/test_demo_report.py": frozenset({"lifecycle._tools.demo.report"}),
    "tools/test_demo_signals.py": frozenset({"lifecycle._tools.demo.main", "lifecycle._tools.demo.options"}),
    "tools/test_usage.py": frozenset(
        {"lifecycle._tools.cli.main", "lifecycle._tools.cli.usage", "lifecycle._tools.demo.options"}
    ),
    "tools/test_diagrams.py": frozenset({"lifecycle._tools.diagrams.draw"}),
    "tools/test_mermaid_parse.py": frozenset({"lifecycle._tools.show.main"}),
    "tools/test_show.py": frozenset({"lifecycle._tools.show.main", "lifecycle._tools.show.model"}),
    "tools/test_show_evidence.py": frozenset(
        {
            "lifecycle._tools.demo.report",
            "lifecycle._tools.show.cause",
            "lifecycle._tools.show.main",
            "lifecycle._tools.show.model",
            "lifecycle._tools.show.synthetic",
            "lifecycle._tools.show.verdict",
        }
    ),
    "tools/test_show_model.py": frozenset({"lifecycle._tools.show.model", "lifecycle._tools.show.verdict"}),
    "tools/test_show_scale.py": frozenset(
        {
            "lifecycle._tools.show.gantt",
            "lifecycle._tools.show.main",
            "lifecycle._tools.show.model",
            "lifecycle._tools.show.svg",
            "lifecycle._tools.show.synthetic",
        }
    ),
    "tools/test_show_verdict.py": frozenset(
        {
            "lifecycle._tools.show.claims",
            "lifecycle._tools.show.gantt",
            "lifecycle._tools.show.main",
            "lifecycle._tools.show.model",
            "lifecycle._tools.show.svg",
            "lifecycle._tools.show.synthetic",
            "lifecycle._tools.show.verdict",
        }
    ),
}
"""Tests of a private module, and the modules each one tests."""


def _is_module(name: str) -> bool:
    """Whether ``name`` (dotted, under the repository) is a module or package of lifecycle."""
    path = TESTS.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(path: Path) -> Iterator[str]:
    """Every private lifecycle module ``path`` imports (``from lifecycle._tools.show import model`` names ``model``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [
                f"{node.module}.{alias.name}" if _is_module(f"{node.module}.{alias.name}") else node.module
                for alias in node.names
            ]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "lifecycle" and any(part.startswith("_") for part in parts):
                yield module


def offences(root: Path) -> list[str]:
    """``file: module`` for each private import under ``root`` that is neither a door nor a unit test's own module."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in DOORS:
            continue
        allowed = UNIT_TESTS.get(rel, frozenset())
        found += [f"{rel}: {module}" for module in sorted(set(private_imports(path))) if module not in allowed]
    return found


def test_only_the_doors_and_unit_tests_import_private_modules() -> None:
    """A test imports a private lifecycle module only if it is that module's unit test; others go through support."""
    assert offences(TESTS) == [], "import these from support.internals or support.torch_internals instead"


def test_the_guard_sees_a_private_import(tmp_path: Path) -> None:
    """A stray ``from lifecycle._core.session import Session`` in a test file is reported, in any import form."""
    (tmp_path / "test_stray.py").write_text(
        "import lifecycle._core.worker\nfrom lifecycle._core.session import Session\n"
        "def f():\n    from lifecycle._tools.show import main\n"
        "from lifecycle import Session\nfrom lifecycle.journal import read\n",
        encoding="utf-8",
    )
    assert offences(tmp_path) == [
        "test_stray.py: lifecycle._core.session",
        "test_stray.py: lifecycle._core.worker",
        "test_stray.py: lifecycle._tools.show.main",
    ]


def test_every_listed_unit_test_imports_what_it_tests() -> None:
    """Each entry of ``UNIT_TESTS`` names a file that still imports each module listed for it."""
    stale = {
        rel: sorted(modules - set(private_imports(TESTS / rel)))
        for rel, modules in UNIT_TESTS.items()
        if not (TESTS / rel).exists() or modules - set(private_imports(TESTS / rel))
    }
    assert stale == {}, "drop these from UNIT_TESTS"
