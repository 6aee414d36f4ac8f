"""The suite's one door to lifecycle's private, torch-free modules.

White-box tests reach here for what no user should touch, and only they: the fuzzers
(the worker pool's idle hooks, the frames they must not trace, the holdings registry),
the meta-tests that break one piece (``Shield._restore``, ``LEFTOVERS.take``,
``Session._journal_move``) to show a checker catches it, the journal writer a session
uses (``RunJournal``), and ``show``'s own functions that tests call in-process. A test
of one private module (``tests/tools/test_show_model.py`` of
``lifecycle._tools.show.model``, say) imports that module itself; everything else
imports it from here, so that what the suite reaches behind the public names is listed
in one place. The torch-dependent ones are in ``support.torch_internals``.
"""

from __future__ import annotations

from lifecycle._core import (
    acquiring,
    errors,
    executor,
    holdings,
    leftovers,
    processes,
    seams,
    session,
    shield,
    signals,
    teardown,
    worker,
    wrapped,
)
from lifecycle._launch import launcher
from lifecycle._liveness import rank as liveness_rank
from lifecycle._tools.demo import console as demo_console
from lifecycle._tools.diagrams import draw as diagrams
from lifecycle._tools.show import gantt, page, synthetic
from lifecycle._tools.show import main as show
from lifecycle._tools.show import model as show_model
from lifecycle._training import journaling, retry

__all__ = [
    "DECISIONS",
    "LEFTOVERS",
    "RANK_LOGS",
    "REGISTRY",
    "STOP_FILE",
    "WORKERS",
    "AnnouncesFailures",
    "Attempt",
    "Holdings",
    "Leftover",
    "RunJournal",
    "Shield",
    "acquiring",
    "child_env",
    "describe",
    "diagrams",
    "executor",
    "final_states",
    "gantt",
    "join_round",
    "kill_group",
    "kill_marked",
    "liveness_rank",
    "marked",
    "page",
    "process_environments",
    "render_timeline",
    "resolve",
    "serve_code",
    "session",
    "shield",
    "show_main",
    "show_model",
    "synthetic",
    "teardown",
    "worker",
    "wrapper_plan",
]

LEFTOVERS = leftovers.LEFTOVERS
"""What sessions left held for the next session to reclaim (``lifecycle._core.leftovers``)."""
Leftover = leftovers.Leftover
REGISTRY = holdings.REGISTRY
"""Every live session's holdings (``lifecycle._core.holdings``)."""
Holdings = holdings.Holdings
WORKERS = worker.POOL
"""lifecycle's worker pool, started with a session (``lifecycle._core.worker``)."""
serve_code = teardown.SERVE_CODE
"""The code of the session's wait loop, whose frames a tracer must skip (how often it runs is timing)."""
Shield = shield.Shield
resolve = signals.resolve
describe = errors.describe
AnnouncesFailures = seams.AnnouncesFailures
wrapper_plan = wrapped.wrapper_plan
Attempt = wrapped.Attempt
"""The restart wrapper's view of a live attempt: its abort and finalize release through ``Attempt.release``."""
process_environments = processes.process_environments
RunJournal = journaling.RunJournal
final_states = show.final_states
show_main = show.show_main
render_timeline = show.render_timeline
child_env = launcher.child_env
"""The environment a launcher gives torchrun and its ranks (``lifecycle._launch.launcher``)."""
kill_group = launcher.kill_group
kill_marked = launcher.kill_marked
marked = launcher.marked
DECISIONS = retry.DECISIONS
"""The journal folder's folder of the job's decisions, one file per failed attempt (``lifecycle._training.retry``)."""
STOP_FILE = retry.STOP_FILE
join_round = retry.join_round
"""The journal folder's file holding a stop decision's JSON line."""
RANK_LOGS = demo_console.RANK_LOGS
"""The demo's folder of its ranks' output, in the journal folder."""
