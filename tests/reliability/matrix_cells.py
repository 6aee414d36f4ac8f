"""The cells of the fault matrix, and which ones cannot exist.

A cell is: where the fault is raised × what is raised × who owns the process group ×
who owns the Megatron globals × restart mode × world size. Pure data: the driver and
the workers both read it.

``make test`` runs a covering subset (``in_make_test``), the rest is marked slow
(``make test-slow``). The rule: every refusal; every point × every raise for the
ordinary two-rank session-owned cells; every point with a plain exception for every
other owner combination, mode and world size; and every raise at train step 2 under
the two-rank Wrapper. So each point, each raise, each owner combination, each mode and
each world size runs in ``make test``; the slow part adds their remaining products.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

POINTS = (
    "pg_init",  # inside init_process_group, before the group exists
    "globals_init",  # inside init_globals, after model-parallel state, before the microbatch calculator
    "setup",  # in the model provider (model/optimizer setup)
    "step",  # train step 2
    "eval",  # the first evaluation
    "checkpoint_save",  # the first checkpoint save
    "checkpoint_finalize",  # the first (collective) commit of a checkpoint
    "on_setup_end",
    "on_train_start",
    "on_step_end",
    "on_eval_end",
    "on_checkpoint_saved",
    "on_train_end",
    "success_teardown",  # a step of the success plan (restoring the signal handlers)
)
CALLBACK_HOOKS = frozenset(p for p in POINTS if p.startswith("on_"))

RAISED = (
    "exception",  # a RuntimeError
    "keyboard_interrupt",
    "system_exit",  # what code that ends a requested exit with sys.exit() raises
    "teardown_step",  # a RuntimeError, and the first step of the failure plan raises too
)
OWNERS = ("session", "caller")
MODES = ("ordinary", "inprocess")
WORLD_SIZES = (1, 2)

INIT_POINTS = frozenset({"pg_init", "globals_init"})
INTERRUPTS = frozenset({"keyboard_interrupt", "system_exit"})


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix."""

    point: str
    raised: str
    group_owner: str
    globals_owner: str
    mode: str
    world_size: int

    @property
    def id(self) -> str:
        """A stable, readable test id."""
        return (
            f"ws{self.world_size}-{self.mode}-pg_{self.group_owner}-mp_{self.globals_owner}-{self.point}-{self.raised}"
        )

    @property
    def refusal(self) -> str | None:
        """Why this cell cannot exist (the run must be refused up front), or None for a real cell.

        Megatron globals owned by the caller on a group the session creates can only be
        left over from a dead group: the session refuses them as stale. Under in-process
        restart the session must create the group and the globals: caller-owned ones are
        refused before the Wrapper starts.
        """
        if self.mode == "inprocess" and "caller" in (self.group_owner, self.globals_owner):
            return "inprocess"
        if self.group_owner == "session" and self.globals_owner == "caller":
            return "stale"
        return None


ALL_CELLS = tuple(
    Cell(point, raised, group, globals_, mode, world)
    for world, mode, group, globals_, point, raised in itertools.product(
        WORLD_SIZES, MODES, OWNERS, OWNERS, POINTS, RAISED
    )
)
CELLS = tuple(cell for cell in ALL_CELLS if cell.refusal is None)
"""The cells that can exist: each runs on its own."""

REFUSED = tuple(
    Cell("refused", "-", group, globals_, mode, world)
    for world, mode, group, globals_ in itertools.product(WORLD_SIZES, MODES, OWNERS, OWNERS)
    if Cell("refused", "-", group, globals_, mode, world).refusal is not None
)
"""The configurations that cannot exist. Each is refused before any failure point is
reached, so its point × raise cells are one run: the refusal, with no fault armed."""


def in_make_test(cell: Cell) -> bool:
    """Whether ``cell`` is in the covering subset that ``make test`` runs (see the module docstring)."""
    if cell.refusal is not None or cell.raised == "exception":
        return True
    owned = cell.group_owner == cell.globals_owner == "session"
    if cell.world_size == 2 and owned and cell.mode == "ordinary":
        return True
    return cell.world_size == 2 and owned and cell.mode == "inprocess" and cell.point == "step"
