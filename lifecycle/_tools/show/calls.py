"""One ``pretrain`` call of one rank in ``show``'s timeline: its timed events and the line on how it ended."""

from __future__ import annotations

from lifecycle._core.states import State
from lifecycle._tools.show.cause import KILLED, killed_by_monitor
from lifecycle._training.exits import STOPPED_BY_LAUNCHER, StoppedByLauncher
from lifecycle.journal import (
    Eval,
    FailedSave,
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
from lifecycle.journal.evidence import Kind


def short(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters (gloo's errors run long)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def named(kind: str, name: str) -> str:
    """``kind:name`` for a named resource (or its step), ``kind`` alone for the others."""
    return f"{kind}:{name}" if name else kind


def ms(seconds: float) -> str:
    """``seconds`` in milliseconds, one decimal: ``"12.3 ms"``."""
    return f"{seconds * 1000:.1f} ms"


_VERBS = {
    "reclaim": "reclaim ",
    "abandoned": "abandon ",
    "wrapper_abort": "wrapper ",
    "wrapper_finalize": "wrapper ",
    "late": "late    ",
}
"""The word a timeline's teardown line starts with, by the record's ``outcome`` (else ``teardown``)."""

_RELEASED_BY = {
    "wrapper_abort": "released by the restart wrapper's abort",
    "wrapper_finalize": "released by the restart wrapper's finalize",
    "late": "a step left running past its deadline that returned late",
}
"""What a release outside the session's plans says when its record has no ``note``."""


def events(call: list[Record]) -> list[tuple[float, str]]:
    """The timed lines of one call: ``(start, text)`` for its start, transitions, teardown steps and last step."""
    events: list[tuple[float, str]] = []
    for r in call:
        if isinstance(r, RunStart):
            o = r.origin
            text = f"pretrain started (pid {r.pid} on {r.host}, restart mode {o.restart_mode}, iteration {o.iteration})"
            events += [(r.start, text)] + ([(r.start, f"    liveness {r.liveness}")] if r.liveness else [])
        elif isinstance(r, Transition):
            text = f"{r.source} → {r.dest}  [{r.trigger}, {ms(r.end - r.start)}]"
            if r.agreed_attempt is not None:
                text += f"  agreed attempt {r.agreed_attempt}"
            if r.store_prefix is not None:
                text += f"  store prefix {r.store_prefix}"
            why = f"  {short(r.detail)}" if r.detail and r.dest == State.FAILED.value else ""
            events.append((r.start, text + why))
        elif isinstance(r, TeardownStep):
            failed = f"  FAILED: {short(r.error)}" if r.error else ""
            verb = _VERBS.get(r.outcome, "teardown")
            said = r.note or _RELEASED_BY.get(r.outcome, "")
            note = f"  ({said})" if said else ""
            step = named(r.step, r.name)
            events.append((r.start, f"    {verb} {step:<32} {ms(r.end - r.start)}{failed}{note}"))
        elif isinstance(r, FailedSave):  # words of the record's failure kind (evidence.WORDS), as everywhere
            then = "training went on" if r.action == "continued" else "the attempt failed on it"
            text = f"{r.failure_kind.words} of step {r.step} ({r.consecutive} in a row; {then}): "
            events.append((r.time, text + short(r.error)))
        elif isinstance(r, StepSkipped):
            who = f"rank {r.culprit}" if r.culprit is not None else f"{r.ranks} rank(s)"
            text = f"step {r.step} skipped: {who} {r.failure_kind.words} ({r.consecutive} in a row)"
            events.append((r.time, text))
        elif isinstance(r, Resumed):  # where training resumed from: the copy in node memory, or a checkpoint
            where = "the copy in node memory" if r.source == "memory" else "the committed checkpoint"
            newest = "none" if r.checkpoint_step is None else f"step {r.checkpoint_step}"
            events.append((r.time, f"resumed after step {r.step} from {where} (newest checkpoint: {newest})"))
        elif isinstance(r, Verdict):  # its words from the typed kind where the record has it (version 4)
            kind = Kind.named(r.evidence.kind if r.evidence is not None else r.verdict)
            said = f"rank {r.culprit} {kind.words if kind is not None else r.verdict}"
            how = KILLED if killed_by_monitor(r) else "named by its liveness monitor"
            where = f"phase {r.phase}" if r.step is None else f"step {r.step}, phase {r.phase}"
            events.append((r.time, f"{how}: {said} ({where})"))
        elif isinstance(r, Suspicion):  # a suspicion kills nothing: said as one, with the deadline it passed
            e = r.evidence
            past = f" (past its {e.deadline_s:.1f} s deadline)" if e.deadline_s is not None else ""
            events.append((r.time, f"suspected by its liveness monitor: {e.words()}{past}; not a verdict"))
        elif isinstance(r, Withdrawal):
            where = f"phase {r.phase}" if r.step is None else f"step {r.step}, phase {r.phase}"
            events.append((r.time, f"suspicion of rank {r.culprit} withdrawn: it made progress ({where})"))
    steps = [r for r in call if isinstance(r, TrainStep)]
    last = steps[-1] if steps else None
    if last is not None and last.end is not None:
        events.append((last.end, f"step {last.step} ended (the last recorded; loss {last.loss:.3f})"))
    return sorted(events, key=lambda event: event[0])


def summary(call: list[Record]) -> str:
    """One line on how a call ended, its losses and checkpoint; a call without an end record was cut short."""
    ends = [r for r in call if isinstance(r, RunEnd)]
    steps = [r for r in call if isinstance(r, TrainStep)]
    evals = [r for r in call if isinstance(r, Eval)]
    if ends:
        end = ends[-1]
        how = f": {short(end.error)}" if end.error else f" (exit: {end.exit_reason})"
        if end.exit_reason == STOPPED_BY_LAUNCHER and not (end.error or "").startswith(StoppedByLauncher.__name__):
            how = f" (stopped by the launcher after a peer failed){how}"  # its own error came first
        head = f"ended {end.state} after step {end.final_step}{how}"
    else:
        states = [r.dest for r in call if isinstance(r, Transition)]
        state = states[-1] if states else State.UNINITIALIZED.value
        last = f"last step {steps[-1].step}" if steps else "no training step recorded"
        rank = call[0].origin.rank if call else -1
        killers = [r for r in call if isinstance(r, Verdict) and r.culprit == rank and killed_by_monitor(r)]
        if killers:
            said = killers[0].evidence
            kind = Kind.named(said.kind if said is not None else killers[0].verdict)
            what = f": it {kind.words}" if kind is not None else ""
            head = f"{KILLED}{what} in state {state} — {last}"
        else:
            head = f"no end record (killed?) in state {state} — {last}"
    if steps:
        first, last_step = steps[0], steps[-1]
        head += f"; loss {first.loss:.3f} (step {first.step}) → {last_step.loss:.3f} (step {last_step.step})"
    if evals:
        head += f"; eval loss {evals[-1].loss:.3f}"
    if ends and ends[-1].checkpoint_step is not None:
        head += f"; checkpoint step {ends[-1].checkpoint_step}"
    failed = [r.step for r in call if isinstance(r, FailedSave)]
    if failed:
        head += f"; {len(failed)} failed save{'s' if len(failed) > 1 else ''} (step {', '.join(map(str, failed))})"
    skipped = sum(isinstance(r, StepSkipped) for r in call)
    if skipped:
        head += f"; {skipped} skipped step{'s' if skipped > 1 else ''}"
    return head
