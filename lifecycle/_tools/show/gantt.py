"""A Mermaid ``gantt`` chart of one attempt of show's model: every rank's states and teardown steps on one time axis.

One section per rank up to ``MAX_ROWS`` ranks; beyond that, the cause's rank (and those
that failed independently) plus one section per group of ranks that ended alike
(``verdict.Group``), drawn from one rank of the group. The cause (``verdict.find_cause``)
is a ``crit`` milestone on its rank's row, in the verdict's words. Times are milliseconds
since the attempt's first record (``dateFormat x``). The text stays far under the 50,000
characters GitHub renders: past ``BUDGET`` the teardown steps are left out (labels are cut to 70 characters, and
sections to ``MAX_ROWS``, in any case).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from lifecycle._tools.show import model as _model
from lifecycle._tools.show.model import Drawn
from lifecycle._tools.show.verdict import Verdict
from lifecycle.journal import Failure, Record, RunEnd, RunStart, TeardownStep, TrainStep, Transition

MAX_ROWS = _model.MAX_ROWS
"""The most sections (rows of ranks) a chart draws."""

COMPACT_FROM = 4
"""Charts of more sections than this are drawn compact (``displayMode: compact``)."""

BUDGET = 40_000
"""The most characters a chart may take (GitHub renders Mermaid only under 50,000)."""

_UNSAFE = re.compile(r"[:;#\n\r\t%`\"<>{}]+")


_BY = {"wrapper_abort": "wrapper abort", "wrapper_finalize": "wrapper finalize", "late": "late"}
"""How a teardown bar is labelled by its record's ``outcome`` (else ``teardown``): who ran the release."""


def _label(text: str, limit: int = 70) -> str:
    """``text`` made safe as a gantt task or section name: no ``:``, ``;``, ``#``, line breaks; cut to ``limit``."""
    clean = _UNSAFE.sub(" ", text).strip() or "?"
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def bars(records: Sequence[Record], *, detail: bool) -> list[tuple[str, str, float, float]]:
    """One rank's bars as (label, tags, start, end), wall-clock times: its states (tag ``done``), the work of each
    move (``active``; ``crit`` into ``failed``) and, with ``detail``, its teardown steps (``crit`` if one failed)."""
    drawn: list[tuple[str, str, float, float]] = []
    starts = [r.start for r in records if isinstance(r, RunStart)]
    since = min(starts) if starts else None
    state = "uninitialized"
    steps = [r.step for r in records if isinstance(r, TrainStep)]
    for r in records:
        if not isinstance(r, Transition):
            continue
        if since is not None and r.start - since >= 0.001:  # a state left within a millisecond is not drawn
            name = state + (f" (steps {steps[0]}-{steps[-1]})" if state == "training" and steps else "")
            drawn.append((name, "done", since, r.start))
        drawn.append(
            (f"{r.trigger} ({r.source} to {r.dest})", "active" if r.dest != "failed" else "crit", r.start, r.end)
        )
        state, since = r.dest, r.end
    last = max((r.end for r in records if isinstance(r, TrainStep | RunEnd) and r.end is not None), default=None)
    if state not in ("closed", "failed") and since is not None and last is not None and last - since >= 0.001:
        name = state + (f" (steps {steps[0]}-{steps[-1]})" if state == "training" and steps else "")
        ended = any(isinstance(r, RunEnd) for r in records)
        drawn.append((name + ("" if ended else " - no end record"), "done", since, last))
    if detail:
        for r in records:
            if isinstance(r, TeardownStep):
                tags = "crit" if r.error else ""
                drawn.append(
                    (
                        f"{_BY.get(r.outcome, 'teardown')} {r.step}"
                        + (f":{r.name}" if r.name else "")
                        + (" FAILED" if r.error else ""),
                        tags,
                        r.start,
                        r.end,
                    )
                )
    return drawn


def gantt(attempt: Drawn) -> str:
    """The gantt chart of one attempt of show's model, titled with its label and verdict, the first failure marked.

    Deterministic for the same records; under ``BUDGET`` characters for any number of ranks.
    """
    title, verdict = attempt.label, attempt.verdict
    headline = verdict.lines(limit=1)[0]
    title = f"{title} - {headline}"
    for detail in (True, False):
        text = _chart(attempt, title, verdict, detail=detail)
        if len(text) <= BUDGET:
            return text
    return text[: BUDGET - 200].rsplit("\n", 1)[0] + "\n"


def _chart(attempt: Drawn, title: str, verdict: Verdict, *, detail: bool) -> str:
    ranks = attempt.ranks
    first_move = attempt.overview.first_move
    t0 = first_move if first_move is not None else 0.0
    drawn_rows, left_out = _model.chart_rows(attempt.overview.journaled, verdict)
    drawn_bars = {row.rank: bars(ranks[row.rank], detail=detail) for row in drawn_rows}
    last = max((end for bs in drawn_bars.values() for _, _, _, end in bs), default=t0)
    span = last - t0
    axis = "%S.%L" if span < 60 else "%M:%S" if span < 3600 else "%H:%M:%S"
    if left_out:
        title += f" ({left_out} more groups not drawn)"
    # Compact (a section's bars share lines where they do not overlap) keeps many ranks' charts short; labels of
    # short bars then collide, so a chart of a few ranks gives each bar a line of its own.
    compact = ["---", "displayMode: compact", "---"] if len(drawn_rows) > COMPACT_FROM else []
    lines = [
        *compact,
        "gantt",
        f"    title {_label(title, 200)}",
        "    dateFormat x",
        f"    axisFormat {axis}",
        "    todayMarker off",
    ]

    def ms(t: float) -> int:
        return round((t - t0) * 1000)

    marked = [verdict.first, *verdict.independent[:3]] if verdict.first is not None else []
    count = 0
    for name, rank in ((row.name, row.rank) for row in drawn_rows):
        lines.append(f"    section {_label(name, 60)}")
        for label, tags, start, end in drawn_bars[rank]:
            count += 1
            a, b = ms(start), max(ms(end), ms(start) + 1)
            lines.append(f"    {_label(label)} :{tags + ', ' if tags else ''}t{count}, {a}, {b}")
        for end_ in marked:
            if end_ is not None and end_.rank == rank and end_.failed_at is not None:
                count += 1
                if end_ is verdict.first and verdict.cause is not None:
                    said = f"the cause - {verdict.cause.words()}"
                else:
                    failure = next((r for r in ranks[rank] if isinstance(r, Failure)), None)
                    said = f"rank {rank} failed independently - {failure.error if failure else end_.error}"
                at = ms(end_.failed_at)
                lines.append(f"    {_label(said, 90)} :crit, milestone, t{count}, {at}, {at}")
    return "\n".join(lines) + "\n"
