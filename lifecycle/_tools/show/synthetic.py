"""Synthetic journals of a training run: what ``show``'s tests, its benchmark and its scale checks read.

``rank_call`` builds one rank's records of one attempt as the session writes them: a
start, the moves up to ``training``, ``steps`` training steps, then one of three ends:
``closed`` (the success teardown), ``failed`` (a ``Failure`` record, the failure
teardown, the move into ``failed``, an end with the error) or ``killed`` (the records
stop, as a SIGKILLed rank's do). Teardown steps name their step and resource kinds as
the declarations in ``lifecycle._core.resources`` do. ``write`` writes records to journal
files with the real writer (``JournalWriter``), one writer per ``pretrain`` call as a
rank's run opens them. Times are wall-clock seconds from ``start``; nothing here runs a
session.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lifecycle._core.resources import Resource, StepKind, declared_resources
from lifecycle.journal import (
    Failure,
    JournalWriter,
    Origin,
    Record,
    RunEnd,
    RunStart,
    TeardownStep,
    TrainStep,
    Transition,
    journal_path,
)

_UP = (("uninitialized", "dist_ready", "init_distributed"), ("dist_ready", "globals_ready", "init_globals"))
_TEARDOWN = (
    StepKind.DESTROY_RERUN_STATE_MACHINE,
    StepKind.ABORT_MODEL_PARALLEL,
    StepKind.ABORT_PROCESS_GROUP,
    StepKind.CLOSE_STORE,
)
"""The steps of a synthetic teardown: the failure plan's, in the canonical order (used for either outcome)."""
STEP_S = 0.01
"""How long each synthetic training step takes."""


def rank_call(
    origin: Origin,
    world_size: int,
    start: float,
    *,
    steps: int,
    end: str = "closed",
    fail_at: float | None = None,
    error: str = "",
    seq: int | None = None,
    first_rank: int | None = None,
    failure_record: bool = True,
    note: str | None = None,
) -> list[Record]:
    """One rank's records of one attempt: up to ``training``, ``steps`` steps, then ``end``.

    ``end`` is ``closed``, ``failed`` or ``killed``. A failing rank fails at ``fail_at``
    (default: just after its last step) with ``error``; with ``failure_record`` it
    journals a ``Failure`` record (``seq`` and ``first_rank`` as given; ``seq`` None:
    the notice could not be published; ``note`` its note, by default one naming
    ``first_rank``) before its failure teardown; without one, its
    journal is what a session before the live failure notice wrote.
    """
    o = origin
    records: list[Record] = [RunStart(origin=o, world_size=world_size, pid=1000 + o.rank, host="node0", start=start)]
    t = start
    for source, dest, trigger in (*_UP, ("globals_ready", "training", "start_training")):
        records.append(Transition(origin=o, source=source, dest=dest, trigger=trigger, start=t, end=t + 0.004))
        t += 0.005
    for step in range(1, steps + 1):
        records.append(TrainStep(origin=o, step=step, loss=3.0 - step * 0.01, start=t, end=t + STEP_S))
        t += STEP_S
    if end == "killed":
        return records
    if end == "closed":
        records.append(Transition(origin=o, source="training", dest="finalizing", trigger="finish", start=t, end=t))
        for name in _TEARDOWN:
            records.append(_teardown(o, "success", name, t))
            t += 0.002
        records.append(
            Transition(origin=o, source="finalizing", dest="closed", trigger="close", start=t - 0.008, end=t)
        )
        reason = "iterations"
        records.append(
            RunEnd(
                origin=o, state="closed", exit_reason=reason, final_step=steps, checkpoint_step=None, error=None, end=t
            )
        )
        return records
    at = t if fail_at is None else fail_at
    if failure_record:
        records.append(
            Failure(
                origin=o,
                phase="step",
                step=steps + 1,
                error=error,
                time=at,
                seq=seq,
                unpublished="" if seq is not None else "the store did not answer",
                first_rank=first_rank,
                note=note if note is not None else f"lifecycle: rank {first_rank} failed first" if first_rank else "",
            )
        )
    t = at
    for name in _TEARDOWN:
        records.append(_teardown(o, "failure", name, t))
        t += 0.002
    records.append(
        Transition(origin=o, source="training", dest="failed", trigger="fail", start=at, end=t, detail=error)
    )
    records.append(
        RunEnd(origin=o, state="failed", exit_reason=None, final_step=steps, checkpoint_step=None, error=error, end=t)
    )
    return records


def _declaring(step: StepKind) -> Resource:
    """The resource kind whose declaration has ``step`` (each step kind has exactly one)."""
    return next(resource for resource in declared_resources() if step in resource.steps)


def _teardown(origin: Origin, outcome: str, step: StepKind, at: float) -> TeardownStep:
    return TeardownStep(
        origin=origin,
        outcome=outcome,
        step=step.value,
        resource=_declaring(step).value,
        owner="session",
        start=at,
        end=at + 0.0015,
    )


def failing_run(
    run_id: str, world_size: int, attempts: int, *, first: int = 1, steps: int = 20, start: float = 1_000.0
) -> dict[int, list[Record]]:
    """Every rank's records of a run of ``attempts`` attempts in which ``first`` fails at a step, each time.

    The others fail 60-80 ms later with a peer's connection error (the port differs per
    rank), their notices naming ``first``; each attempt starts a second after the last
    ended. Returns rank → records, in the order each rank's journal holds them
    (``failing_rank`` of each rank).
    """
    return {
        rank: failing_rank(run_id, world_size, attempts, rank, first=first, steps=steps, start=start)
        for rank in range(world_size)
    }


def failing_rank(
    run_id: str, world_size: int, attempts: int, rank: int, *, first: int = 1, steps: int = 20, start: float = 1_000.0
) -> list[Record]:
    """``rank``'s records of ``failing_run``: one rank's journal at a time, for runs too large to hold at once."""
    records: list[Record] = []
    t = start
    for attempt in range(attempts):
        fail_at = t + 0.015 + steps * STEP_S
        origin = Origin(run_id, rank, attempt, "ordinary", 0)
        if rank == first:
            error, seq, named, at = f"InjectedFault: injected at step {steps + 1}", 1, None, fail_at
        else:
            delay = 0.060 + 0.020 * ((rank * 7919) % world_size) / max(world_size - 1, 1)
            error = f"RuntimeError: Connection closed by peer [10.0.0.2]:{20000 + rank}"
            seq, named, at = 2 + (rank if rank < first else rank - 1), first, fail_at + delay
        records += rank_call(
            origin, world_size, t, steps=steps, end="failed", fail_at=at, error=error, seq=seq, first_rank=named
        )
        t = fail_at + 1.0
    return records


def write(folder: Path, ranks: dict[int, Iterable[Record]]) -> list[Path]:
    """Append each rank's records to ``folder``/``rank<R>.jsonl`` with ``JournalWriter``; the paths.

    Each ``RunStart`` opens a writer (as each ``pretrain`` call does) that writes the
    records up to the next; ``ValueError`` if a rank's records do not start with one.
    """
    paths = []
    for rank, records in ranks.items():
        path = journal_path(folder, rank)
        writer: JournalWriter | None = None
        try:
            for record in records:
                if isinstance(record, RunStart):
                    if writer is not None:
                        writer.close()
                    writer = JournalWriter(path, record)
                elif writer is None:
                    raise ValueError(f"rank {rank}'s records start with a {record.kind!r} record, not a RunStart")
                else:
                    writer.write(record)
        finally:
            if writer is not None:
                writer.close()
        paths.append(path)
    return paths
