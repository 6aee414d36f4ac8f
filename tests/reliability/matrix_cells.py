"""The cells of the fault matrix, and which ones cannot exist.

A cell is: where the fault is raised × what is raised × who owns the process group ×
who owns the Megatron globals × restart mode × world size. Pure data: the driver and
the workers both read it. A point at a success-plan step that a configuration does not
have (the session never destroys the caller's group or globals) is no cell at all: see
``Cell.absent``.

``make test`` runs a covering subset (``in_make_test``), the rest is marked slow
(``make test-slow``). The rule: every refusal; every point × every raise for the
ordinary two-rank session-owned cells; every point with a plain exception for every
other owner combination, mode and world size; and every raise at train step 2 under
the two-rank Wrapper; but of the points at the session's own success steps
(``SUCCESS_STEP_POINTS``) only a few cells: each with a plain exception on the ordinary
two-rank session-owned cells, and one Ctrl-C (at the globals' destroy, before the
barrier). So each point, each raise, each owner combination, each mode and each world
size runs in ``make test``; the slow part adds their remaining products.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

POINTS = (
    "pg_init",  # at the start of the distributed init, before the store and the group exist
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
    # The steps of the success plan that close() runs, in its order; each fires only while
    # close() runs its success plan (never on the failure plan it switches to).
    "success_finalize_checkpoints",  # the finalize_checkpoints step (pretrain committed the last save already)
    "success_teardown",  # a user release registered by a hook (release_user_resource)
    "success_destroy_globals",  # destroy_model_parallel, the last globals step, before the barrier
    "success_barrier",  # the barrier before the group is destroyed
    "success_destroy_group",  # destroy_process_group, after the barrier
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
SUCCESS_POINTS = frozenset(p for p in POINTS if p.startswith("success_"))
"""The points in ``close()``'s success plan: a failed step switches the session to the failure plan."""
SUCCESS_STEP_POINTS = SUCCESS_POINTS - {"success_teardown"}
"""The success-plan points at the session's own steps (not a user release)."""
STEP_NEEDS = {
    "success_destroy_globals": "globals",
    "success_barrier": "group",
    "success_destroy_group": "group",
}
"""A success-plan point whose step exists only when the session owns the group / the globals."""


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix."""

    point: str
    raised: str
    group_owner: str
    globals_owner: str
    mode: str
    world_size: int
    gloo_copies: bool = False
    """Megatron-core's gloo copies of the data-parallel groups on (``create_gloo_process_groups``)."""

    @property
    def id(self) -> str:
        """A stable, readable test id."""
        return (
            f"ws{self.world_size}-{self.mode}-pg_{self.group_owner}-mp_{self.globals_owner}-{self.point}-{self.raised}"
            + ("-gloo_copies" if self.gloo_copies else "")
        )

    @property
    def absent(self) -> str | None:
        """Why this cell does not exist at all, or None.

        A success-plan step of the group or the globals is planned only for what the
        session owns: with the caller's group (or globals) ``close()`` never runs the
        barrier and ``destroy_process_group`` (or the globals' destroys), so a fault
        there has nowhere to fire. Unlike a refusal, nothing is run for it.
        """
        needs = STEP_NEEDS.get(self.point)
        owner = {"group": self.group_owner, "globals": self.globals_owner}.get(needs or "")
        return None if owner in (None, "session") else f"the session never destroys the caller's {needs}"

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
    cell
    for world, mode, group, globals_, point, raised in itertools.product(
        WORLD_SIZES, MODES, OWNERS, OWNERS, POINTS, RAISED
    )
    if (cell := Cell(point, raised, group, globals_, mode, world)).absent is None
)
"""Every cell that exists: real or refused (absent ones are not listed)."""
CELLS = tuple(cell for cell in ALL_CELLS if cell.refusal is None)
"""The cells that can exist: each runs on its own."""

GLOO_COPY_SEED = 23
GLOO_COPY_SAMPLE = 4
GLOO_COPY_CELLS = tuple(
    Cell(point, "exception", "session", "session", "ordinary", 2, gloo_copies=True)
    for point in POINTS
    if Cell(point, "exception", "session", "session", "ordinary", 2).absent is None
)
"""Every point with Megatron's gloo copies on (two ranks, session-owned, ordinary; a plain exception): a
failure teardown must not wait on work pending on a copy. ``GLOO_COPY_SAMPLE`` of them, drawn with
``GLOO_COPY_SEED``, run in ``make test``; the rest in ``make test-slow``."""
GLOO_COPY_IN_MAKE_TEST = frozenset(
    random.Random(GLOO_COPY_SEED).sample([c.point for c in GLOO_COPY_CELLS if c.point != "pg_init"], GLOO_COPY_SAMPLE)
)  # drawn from the points where the copies exist (at pg_init nothing of Megatron's does)

REFUSED = tuple(
    Cell("refused", "-", group, globals_, mode, world)
    for world, mode, group, globals_ in itertools.product(WORLD_SIZES, MODES, OWNERS, OWNERS)
    if Cell("refused", "-", group, globals_, mode, world).refusal is not None
)
"""The configurations that cannot exist. Each is refused before any failure point is
reached, so its point × raise cells are one run: the refusal, with no fault armed."""


def in_make_test(cell: Cell) -> bool:
    """Whether ``cell`` is in the covering subset that ``make test`` runs (see the module docstring)."""
    owned = cell.group_owner == cell.globals_owner == "session"
    if cell.gloo_copies:
        return cell.point in GLOO_COPY_IN_MAKE_TEST
    if cell.point in SUCCESS_STEP_POINTS and cell.refusal is None:
        ordinary_pair = cell.world_size == 2 and owned and cell.mode == "ordinary"
        interrupt = (cell.point, cell.raised) == ("success_destroy_globals", "keyboard_interrupt")
        return ordinary_pair and (cell.raised == "exception" or interrupt)
    if cell.refusal is not None or cell.raised == "exception":
        return True
    if cell.world_size == 2 and owned and cell.mode == "ordinary":
        return True
    return cell.world_size == 2 and owned and cell.mode == "inprocess" and cell.point == "step"
