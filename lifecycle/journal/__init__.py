"""The run journal, a file format: one file per rank, one JSON record per line, schema version 4.

``pretrain`` (with ``journal_dir``) writes a rank's records to ``<dir>/rank<R>.jsonl``
as they happen; ``python -m lifecycle show`` reads them, and so can anyone: ``read``
(or ``load``, which also reports torn lines; ``load_each``, a file at a time; ``stream``,
a record at a time) returns typed, frozen records, version 1, 2 and 3 files included, and
with ``strict=False`` skips damaged lines and files, saying what it skipped
(``Skipped``); ``JournalWriter`` appends them. The record types:

- ``RunStart`` (``run``): a ``pretrain`` call started; a writer's first record.
- ``Transition`` (``transition``): the session moved between states.
- ``TeardownStep`` (``teardown``): a teardown step ran (or was reclaimed, or abandoned).
- ``Left`` (``left``): a resource the teardown left alone, and why.
- ``TrainStep`` (``step``) and ``Eval`` (``eval``): a training step, an evaluation.
- ``Failure`` (``failure``): this rank failed (written before its failure teardown).
- ``RunEnd`` (``end``): the call ended.
- ``Verdict`` (``verdict``): a liveness monitor named a stopped, spinning, hung, dead or unresponsive rank.
- ``MonitorLost`` (``monitor_lost``): the rank's liveness monitor exited while it trained, and what the rank did.
- ``FailedSave`` (``save_failed``): a checkpoint save every rank dropped, the failures it had, what the rank did.
- ``StepSkipped`` (``step_skipped``): a step whose update no rank applied (its loss was not finite).
- ``JobDecision`` (``decision``): the job's decision after a failed attempt (restart, or stop and why), written once
  per attempt by the rank that recorded it.
- ``Resumed`` (``resume``): where the call resumed training from (the copy in node memory, or a checkpoint).
- ``Suspicion`` (``suspicion``) and ``Withdrawal`` (``withdrawal``): a monitor's suspicion of a rank, and its
  withdrawal when the rank made progress again: never a failure.
- ``Collectives`` (``collectives``): where a failing rank stood in each process group's collectives
  (``GroupPosition``: entered, left, the op), written on its failure edge.

A failure's facts are typed once, in ``lifecycle.journal.evidence`` (its ``Kind``, their
words, ``Evidence``, the rule that tells a consequence): the ``evidence`` and ``first``
fields of ``Failure`` and ``Verdict`` records hold them.

Each carries its ``Origin`` (run id, rank, attempt...). ``docs/journal.md`` is the
schema, field by field, and how versions 1, 2 and 3 read. This package imports nothing
but the standard library (no torch): a tool may read journals anywhere.
"""

from lifecycle.journal._files import (
    JournalWriter,
    Loaded,
    Problem,
    Skipped,
    each_file,
    journal_files,
    journal_path,
    load,
    load_each,
    parse,
    read,
    restart_count,
    run_id,
    stream,
)
from lifecycle.journal._older import V1_RUN_ID
from lifecycle.journal._records import (
    KINDS,
    VERSION,
    Collectives,
    Eval,
    FailedSave,
    Failure,
    GroupPosition,
    JobDecision,
    Left,
    MonitorLost,
    Origin,
    Record,
    Resumed,
    RunEnd,
    RunStart,
    StepSkipped,
    Suspicion,
    TeardownStep,
    TrainStep,
    Transition,
    Verdict,
    Withdrawal,
)

__all__ = [
    "KINDS",
    "V1_RUN_ID",
    "VERSION",
    "Collectives",
    "Eval",
    "FailedSave",
    "Failure",
    "GroupPosition",
    "JobDecision",
    "JournalWriter",
    "Left",
    "Loaded",
    "MonitorLost",
    "Origin",
    "Problem",
    "Record",
    "Resumed",
    "RunEnd",
    "RunStart",
    "Skipped",
    "StepSkipped",
    "Suspicion",
    "TeardownStep",
    "TrainStep",
    "Transition",
    "Verdict",
    "Withdrawal",
    "each_file",
    "journal_files",
    "journal_path",
    "load",
    "load_each",
    "parse",
    "read",
    "restart_count",
    "run_id",
    "stream",
]
