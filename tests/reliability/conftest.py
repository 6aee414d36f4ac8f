"""Prints the fault matrix's summary table after the run."""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One row per world size × restart mode × owners: cells passed of cells run (only those that ran)."""
    # Under --import-mode=importlib the test module's name is derived from its path.
    module = next((m for name, m in list(sys.modules.items()) if name.endswith("test_fault_matrix")), None)
    if module is None or not getattr(module, "RESULTS", None):
        return
    from reliability.matrix_cells import ALL_CELLS, CELLS, GLOO_COPY_CELLS, POINTS, RAISED, REFUSED

    def config(cell: Any) -> tuple[Any, ...]:
        return (cell.world_size, cell.mode, cell.group_owner, cell.globals_owner)

    # A refused configuration is one run that stands for each of its cells (absent points excluded).
    cells_of: dict[tuple[Any, ...], int] = defaultdict(int)
    for cell in ALL_CELLS:
        cells_of[config(cell)] += 1
    rows: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    for cell in CELLS + REFUSED:
        if cell.id in module.RESULTS:
            key = (*config(cell), cell.refusal or "-")
            weight = 1 if cell.refusal is None else cells_of[config(cell)]
            rows[key][0] += weight * module.RESULTS[cell.id]
            rows[key][1] += weight
    write = terminalreporter.write_line
    write("")
    write(
        f"fault matrix: cells passed of cells run, of {len(ALL_CELLS)} in all (a full row: up to {len(POINTS)} "
        f"failure points x {len(RAISED)} kinds of raise, less the success steps of what the caller owns; "
        "a refused row is one run, refused before any point)"
    )
    write(f"{'ranks':>5}  {'mode':<10} {'group':<8} {'globals':<8} {'refused':<10} passed")
    for (world, mode, group, globals_, refusal), (passed, total) in sorted(rows.items()):
        write(f"{world:>5}  {mode:<10} {group:<8} {globals_:<8} {refusal:<10} {passed}/{total}")
    passed = sum(p for p, _ in rows.values())
    total = sum(t for _, t in rows.values())
    write(f"total: {passed}/{total} cells passed")
    copies = [module.RESULTS[cell.id] for cell in GLOO_COPY_CELLS if cell.id in module.RESULTS]
    if copies:
        write(f"with Megatron's gloo copies (2 ranks, ordinary, session-owned): {sum(copies)}/{len(copies)} passed")
