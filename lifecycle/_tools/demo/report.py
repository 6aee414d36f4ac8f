"""The demo's report, read from the journals only: every rank's timeline, the diagrams, then one verdict line.

The verdict never trusts torchrun's exit code: the run succeeded when every rank's last
attempt ended ``closed`` in its journal (a stop asked for by a signal included, and a
stop during start-up, before any rank started ``pretrain``). A rank without a journal,
or whose journal has no end record, did not. A failed run's last line names its cause in
``show``'s words (``verdict.find_cause``: the rank, the kind, the step) and the job's
last decision (``lifecycle._training.retry.last_decision``: restart, or stop and why).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from pathlib import Path

from lifecycle import journal as _journal
from lifecycle._tools.demo.console import TORCHRUN_LOG
from lifecycle._tools.show import main as _show
from lifecycle._tools.show import model as _model
from lifecycle._training.retry import last_decision, recorded_decisions


@dataclasses.dataclass(slots=True)
class Ending:
    """How the launcher's wait for torchrun ended: torchrun's code, the signals that stopped it, what it did."""

    returncode: int | None = None
    stop_signal: str | None = None
    killed: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """What the report needs to know of the run: where, how many ranks, its id, its rendezvous and timeout.

    ``removed``: the journal folder is a temporary one the demo removes at exit: no diagrams or page are written.
    """

    journal_dir: Path
    nproc: int
    run_id: str
    rendezvous: str
    local: bool
    timeout_s: float
    removed: bool = False


def rank_journals(folder: Path) -> list[Path]:
    """The journals (``rank<R>.jsonl`` files) in ``folder``; none if it cannot be listed."""
    try:
        return _journal.journal_files(folder)
    except OSError:
        return []


def report(run: Run, ending: Ending, elapsed: float) -> int:
    """Print the timeline and the diagrams' paths, then the verdict from the journals; return the exit code."""
    journal_dir, nproc = run.journal_dir, run.nproc
    records: list[_journal.Record] = []
    try:
        loaded = _journal.load([journal_dir])
    except (OSError, ValueError) as exc:
        print(f"demo: cannot read the journals: {exc}", file=sys.stderr)
    else:
        # Only this demo's ranks: a journal another run left here is not this run's story.
        records = [r for r in loaded.records if r.origin.run_id == run.run_id and r.origin.rank < nproc]
        for where in loaded.torn:
            print(f"demo: {where}: torn line skipped (its writer was killed mid-write?)", file=sys.stderr)
        for note in getattr(loaded, "ignored", ()):
            print(f"demo: {note}", file=sys.stderr)
    model = _model.build(records) if records else None  # built once: every view below reads it
    print("\n=== timeline (seconds since the first rank started) ===")
    recorded = recorded_decisions([journal_dir])
    timeline = _show.render_timeline(model, verdicts=True, decisions=recorded) if model is not None else None
    print("\n".join(timeline or ["(no journal records)"]))
    if model is not None and run.removed:
        print(f"\ndemo: {journal_dir} is a temporary folder, removed at exit (--keep keeps it, for show and its page)")
    elif model is not None:
        paths = _show.write_diagrams(model, journal_dir)
        paths.append(_show.write_page(model, journal_dir / "show.html"))
        print("\n=== lifecycle diagrams (path taken highlighted) ===")
        print("\n".join(f"  {p}" for p in paths))
        print(f"\ndemo: see it again with: {sys.executable} -m lifecycle show {journal_dir}")
    else:
        print()
    states = {rank: "no journal" for rank in range(nproc)} | _show.final_states(records)
    ok = all(state == "closed" for state in states.values())
    shown = {"?": "cut short (no end record)"}
    listed = ", ".join(f"rank {rank}: {shown.get(state, state)}" for rank, state in states.items())
    facts = f"({listed}; torchrun exit code {ending.returncode})"
    if not records and ending.stop_signal is not None and ending.killed is None and ending.returncode is not None:
        # Stopped before any rank started pretrain: nothing to save or close, and nothing was left running.
        ok = True
        verdict = f"stopped on {ending.stop_signal} during start-up, as asked: no rank had started pretrain {facts}"
    elif ok and ending.stop_signal is not None and not any(isinstance(r, _journal.TrainStep) for r in records):
        verdict = f"stopped on {ending.stop_signal} during start-up, as asked: every started rank closed {facts}"
    elif ok and ending.stop_signal is not None:
        verdict = f"stopped on {ending.stop_signal} in {elapsed:.1f} s, as asked: every rank saved and closed {facts}"
    elif ok:
        verdict = f"succeeded in {elapsed:.1f} s {facts}"
    else:
        launcher = launcher_words(ending)
        decided = last_decision(journal_dir, run.run_id)
        said = f"the job decided to {decided.line()}" if decided is not None else ""
        why = ending.killed or "; ".join(part for part in (launcher, _why_failed(states, model, run), said) if part)
        verdict = f"FAILED in {elapsed:.1f} s: {why} {facts}"
    print(f"demo: {verdict}", flush=True)
    return 0 if ok else 1


def launcher_words(ending: Ending) -> str:
    """What became of torchrun's agent when a signal from outside ended it (its exit code is minus the signal's
    number, and the demo sent none): ``torchrun's agent was killed (SIGKILL)``; "" otherwise."""
    code = ending.returncode
    if code is None or code >= 0 or ending.killed is not None or ending.stop_signal is not None:
        return ""
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    verb = "was killed" if name == "SIGKILL" else "was stopped from outside"
    return f"torchrun's agent {verb} ({name})"


def _cause(model: _model.Model | None) -> str:
    """The first line of the last failed attempt's verdict (its cause, in ``show``'s words); "" if none failed."""
    if model is None:
        return ""
    for run in reversed(model.runs):
        for attempt in reversed(run.drawn):
            if attempt.verdict.cause is not None:
                return attempt.verdict.cause.line()
    return ""


def _why_failed(states: dict[int, str], model: _model.Model | None, run: Run) -> str:
    """The reason the verdict gives for a run where some rank's last attempt did not end ``closed``.

    ``model``: the journals' (None: no record of this run)."""
    cause = _cause(model)
    if cause:
        return cause
    if model is None:
        where = "" if run.local else ", not an address of this machine"
        return (
            f"no rank wrote a journal: torchrun ended before any rank started (see its output in "
            f"{run.journal_dir / TORCHRUN_LOG}; "
            f"the rendezvous was {run.rendezvous}{where}, --timeout {run.timeout_s:g})"
        )
    how = {"failed": "ended failed", "?": "cut short (killed?)", "no journal": "never started pretrain"}
    parts = []
    for state, said in how.items():
        ranks = [str(rank) for rank, s in states.items() if s == state]
        if ranks:
            parts.append(f"{'ranks' if len(ranks) > 1 else 'rank'} {', '.join(ranks)} {said}")
    return "; ".join(parts) or "not every rank ended closed"
