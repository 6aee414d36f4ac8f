"""Power tools: the machinery under ``Session`` and ``pretrain``, for code that extends or inspects it.

``lifecycle`` exports the names a training script, a loop of your own and a test need;
this module exports the rest of what the library is built from. Reach for it to:

- **declare a resource kind of your own** that every session then acquires, records and
  releases like the built-in ones: ``Resource``, ``Handler``, ``StepKind``, ``Releases``,
  ``WrapperRole``, ``declare_resource`` / ``undeclare_resource``, ``declared_resources``,
  ``live_resources``;
- **plan or run a teardown yourself**, or read one: ``plan_teardown`` (a pure function of
  ledger, restart mode and outcome), ``teardown``, ``Teardown``, ``Plan``, ``Step``,
  ``Outcome``, ``RestartMode``, ``LeftReason``; what ran: ``TeardownReport``,
  ``StepRecord`` (``session.report``), and what others released of the session's
  entries, who and when: ``Released``, ``Releaser`` (``report.released_elsewhere``);
- **read the ownership ledger**: ``Ledger``, ``LedgerEntry`` (``session.ledger``);
- **query the transition table**: ``TRANSITIONS``, ``Edge``, ``edges_from``,
  ``reachable_states`` (the diagrams in ``diagrams/`` are drawn from it);
- **read a session's events**: ``JournalEntry`` (``session.journal``, ``PretrainResult.journal``),
  ``SessionEvent`` and its kinds ``TransitionEvent``, ``TeardownEvent``, ``FailureEvent``,
  ``ReclaimEvent``, ``ReleaseEvent``;
- **drive a session on actions of your own**: the seams ``DistributedActions`` (what
  ``Session`` drives; ``TorchActions`` and ``lifecycle.testing.RecordingActions`` are two),
  ``CheckpointWriter`` (what ``Session.track_checkpoints`` takes), ``Announcement``,
  ``ProgressSink`` (where ``Session.progress`` also sends each mark: ``session.progress_sink``);
- **log progress in a loop of your own**: ``ProgressLog``, the callback ``pretrain`` adds
  for ``training.log_interval``;
- **decide after a failed attempt** in a retry loop of your own, as the demo's
  ``--retry`` and a torchrun restart do (docs/recovery.md): ``decide_after`` (the
  job's decision, recorded once in the journal folder or torchrun's agent store),
  ``last_decision``, ``note_host`` (a rank's host, for a peer to name it),
  ``agent_store`` and ``join_round`` (a job on several nodes: the store they share, a
  restart count the same on every agent),
  ``Decision``, ``RestartPolicy`` (its limits), ``Attempt`` and ``Frame`` (the facts
  it judges), ``decide`` (the pure policy).

Like ``lifecycle``, importing this module loads no torch, megatron-core or NVRx. These
names are as stable as the top level's; they are here because most code never needs them.
"""

from lifecycle._core.events import (
    FailureEvent,
    JournalEntry,
    ReclaimEvent,
    ReleaseEvent,
    SessionEvent,
    TeardownEvent,
    TransitionEvent,
)
from lifecycle._core.executor import Released, Releaser, StepRecord, TeardownReport
from lifecycle._core.exports import publish
from lifecycle._core.ownership import Ledger, LedgerEntry
from lifecycle._core.plans import LeftReason, Outcome, Plan, RestartMode, Step, Teardown, plan_teardown, teardown
from lifecycle._core.resources import (
    Handler,
    Releases,
    Resource,
    StepKind,
    WrapperRole,
    declare_resource,
    declared_resources,
    live_resources,
    undeclare_resource,
)
from lifecycle._core.seams import Announcement, CheckpointWriter, DistributedActions, ProgressSink
from lifecycle._core.table import TRANSITIONS, Edge, edges_from, reachable_states
from lifecycle._training.callbacks import ProgressLog
from lifecycle._training.decide import Attempt, Decision, Frame, RestartPolicy, decide
from lifecycle._training.retry import agent_store, decide_after, join_round, last_decision, note_host

__all__ = [
    "TRANSITIONS",
    "Announcement",
    "Attempt",
    "CheckpointWriter",
    "Decision",
    "DistributedActions",
    "Edge",
    "FailureEvent",
    "Frame",
    "Handler",
    "JournalEntry",
    "Ledger",
    "LedgerEntry",
    "LeftReason",
    "Outcome",
    "Plan",
    "ProgressLog",
    "ProgressSink",
    "ReclaimEvent",
    "ReleaseEvent",
    "Released",
    "Releaser",
    "Releases",
    "Resource",
    "RestartMode",
    "RestartPolicy",
    "SessionEvent",
    "Step",
    "StepKind",
    "StepRecord",
    "Teardown",
    "TeardownEvent",
    "TeardownReport",
    "TransitionEvent",
    "WrapperRole",
    "agent_store",
    "decide",
    "decide_after",
    "declare_resource",
    "declared_resources",
    "edges_from",
    "join_round",
    "last_decision",
    "live_resources",
    "note_host",
    "plan_teardown",
    "reachable_states",
    "teardown",
    "undeclare_resource",
]

publish(globals())
