"""The pictures of ``show --html``, drawn here as SVG: no npm, no Graphviz, no network.

``timeline(drawn)``: one attempt on one time axis, one row per rank up to
``gantt.MAX_ROWS`` (16) ranks; beyond that, the cause's rank, the independent failures
and one row per group of ranks that ended alike (``gantt.rows``: the culprit's row is
always kept). Each row has its states and moves as bars (``gantt.bars``) on top and its
teardown steps below them; the cause is a red mark on its rank's row, in the verdict's
words. Every bar, row and mark has a ``<title>`` (the browser's hover text). Rows are
``<g class="row" data-rank="R">``; the cause's row has ``data-cause="true"`` and holds
the ``class="cause"`` mark (what the browser test reads).

``path(drawn)``: the path each rank took through the states, as boxes and labelled
arrows, ranks that took the same path drawn once (final states with a double border,
the failed state red).

Both are ``<svg>`` elements with a ``viewBox`` and ``width="100%"`` (at most
``WIDTH`` pixels): they scale down to any window and never widen the page. Their size
grows with the rows drawn (at most 16 + a few), not with the number of ranks.
"""

from __future__ import annotations

import html

from lifecycle._core.states import State
from lifecycle._tools.show import gantt
from lifecycle._tools.show import model as _model
from lifecycle._tools.show.cause import compact
from lifecycle._tools.show.model import Drawn

WIDTH = 1200
"""The pictures' width in pixels at full size (a 1,400-pixel window shows them whole)."""

_LABEL_W = 250
_RIGHT = 20
_ROW_H = 34
_BAR_H = 14
_TEAR_H = 8
_AXIS_H = 28

_FILL = {"done": "#90caf9", "active": "#1565c0", "crit": "#c62828", "": "#ffb74d"}
"""Bar colours by ``gantt.bars``' tag: a state, a move, into ``failed`` (or a failed teardown step), a teardown step."""

_CSS = (
    "text{font-family:sans-serif;font-size:12px;fill:#222}"
    ".axis text{font-size:11px;fill:#555}.axis line{stroke:#ddd}"
    ".row-label{font-weight:normal}.culprit .row-label{fill:#c62828;font-weight:bold}"
    ".culprit rect.band{fill:#ffebee}rect.band{fill:#fafafa}"
    ".cause{fill:#c62828;stroke:#7f0000;stroke-width:1}"
    ".state{fill:#fff;stroke:#1565c0;stroke-width:1.5}.state.final{stroke-width:3}"
    ".state.failed{fill:#ffebee;stroke:#c62828}.edge{stroke:#1565c0;stroke-width:1.5;fill:none}"
)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tick_step(span: float) -> float:
    """A round tick interval giving 4 to 10 ticks over ``span`` seconds."""
    step = 0.001
    while span / step > 10:
        for factor in (2, 2.5, 2):
            step *= factor
            if span / step <= 10:
                break
    return step


def timeline(drawn: Drawn) -> str:
    """The timeline of one attempt as an ``<svg>`` element (see the module doc)."""
    ranks, verdict = drawn.ranks, drawn.verdict
    rows, left_out = _model.chart_rows(drawn.overview.journaled, verdict)
    drawn_rows = [(row.name, row.rank) for row in rows]
    per_rank = {rank: gantt.bars(ranks[rank], detail=True) for _, rank in drawn_rows}
    first_event = drawn.overview.first_event
    t0 = first_event if first_event is not None else drawn.t0
    ends = [end for bars in per_rank.values() for _, _, _, end in bars]
    first = verdict.first
    if first is not None and first.failed_at is not None:
        ends.append(first.failed_at)
    span = max(max(ends, default=t0) - t0, 0.001)
    plot_w = WIDTH - _LABEL_W - _RIGHT
    height = _AXIS_H + _ROW_H * len(drawn_rows) + (44 if left_out else 26)

    def x(t: float) -> float:
        return _LABEL_W + (t - t0) / span * plot_w

    out = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="100%"'
        f' style="max-width:{WIDTH}px" role="img" aria-label="{_e(drawn.label)} timeline">',
        f"<style>{_CSS}</style>",
        f"<title>{_e(drawn.label)}: {_e(verdict.headline())}</title>",
        '<g class="axis">',
    ]
    step = _tick_step(span)
    tick = 0.0
    while tick <= span + 1e-9:
        tx = _LABEL_W + tick / span * plot_w
        bottom = _AXIS_H + _ROW_H * len(drawn_rows)
        out.append(f'<line x1="{tx:.1f}" y1="{_AXIS_H - 6}" x2="{tx:.1f}" y2="{bottom}"/>')
        out.append(f'<text x="{tx:.1f}" y="{_AXIS_H - 10}" text-anchor="middle">{_e(_tick_label(tick, step))}</text>')
        tick += step
    out.append("</g>")
    cause_rank = first.rank if first is not None else None
    for i, (name, rank) in enumerate(drawn_rows):
        y = _AXIS_H + i * _ROW_H
        culprit = rank == cause_rank
        label = f"{name} — the cause" if culprit and "(the cause)" not in name else name
        attrs = f'class="row{" culprit" if culprit else ""}" data-rank="{rank}"'
        if culprit:
            attrs += ' data-cause="true"'
        out.append(f"<g {attrs}>")
        out.append(f"<title>{_e(label)}</title>")
        out.append(f'<rect class="band" x="0" y="{y + 1}" width="{WIDTH}" height="{_ROW_H - 2}"/>')
        out.append(f'<text class="row-label" x="6" y="{y + 16}">{_e(_cut(label, 40))}</text>')
        for text, tag, start, end in per_rank[rank]:
            teardown = tag == "" or text.startswith("teardown ")
            bx = x(start)
            bw = max(x(end) - bx, 1.0)
            by = y + 4 + (_BAR_H + 2 if teardown else 0)
            bh = _TEAR_H if teardown else _BAR_H
            fill = _FILL["crit"] if tag == "crit" else _FILL["" if teardown else tag]
            hover = f"{text}: {_ms(start - t0)} → {_ms(end - t0)} ({_ms(end - start)})"
            out.append(
                f'<rect class="bar" x="{bx:.1f}" y="{by}" width="{bw:.1f}" height="{bh}" fill="{fill}">'
                f"<title>{_e(hover)}</title></rect>"
            )
        if culprit and first is not None and first.failed_at is not None and verdict.cause is not None:
            cx, cy = x(first.failed_at), y + _ROW_H / 2
            points = f"{cx:.1f},{cy - 9:.1f} {cx + 7:.1f},{cy:.1f} {cx:.1f},{cy + 9:.1f} {cx - 7:.1f},{cy:.1f}"
            out.append(
                f'<polygon class="cause" points="{points}"><title>the cause: {_e(verdict.cause.words())}</title>'
                "</polygon>"
            )
        out.append("</g>")
    legend_y = _AXIS_H + _ROW_H * len(drawn_rows) + 16
    lx = float(_LABEL_W)
    for name, fill in (("state", _FILL["done"]), ("move", _FILL["active"]), ("into failed", _FILL["crit"]),
                       ("teardown step", _FILL[""])):  # fmt: skip
        out.append(f'<rect x="{lx:.0f}" y="{legend_y - 9}" width="12" height="10" fill="{fill}"/>')
        out.append(f'<text x="{lx + 16:.0f}" y="{legend_y}">{name}</text>')
        lx += 24 + 7 * len(name) + 16
    diamond = f"{lx + 6},{legend_y - 10} {lx + 12},{legend_y - 4} {lx + 6},{legend_y + 2} {lx},{legend_y - 4}"
    out.append(f'<polygon points="{diamond}" fill="{_FILL["crit"]}"/>')
    out.append(f'<text x="{lx + 18:.0f}" y="{legend_y}">the cause</text>')
    if left_out:
        y = legend_y + 18
        out.append(
            f'<text x="6" y="{y}">… and {left_out} more groups of ranks, not drawn (the verdict lists them)</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _tick_label(tick: float, step: float) -> str:
    """``+1.50 s``, ``+250 ms``: a tick's time since the attempt's first event."""
    if step < 1:
        return f"+{tick * 1000:.0f} ms" if tick < 1 else f"+{tick:.2f} s"
    return f"+{tick:.0f} s"


_BOX_W = 124
_BOX_H = 34
_GAP = 84
_PER_LINE = 6


def path(drawn: Drawn) -> str:
    """The path each rank took through the states, as an ``<svg>`` element (ranks with the same path drawn once)."""
    finals = {s.value for s in State if s.is_final}
    arrow = f"arrow-{drawn.stem}"  # one page holds many pictures: each its own marker id
    blocks: list[str] = []
    y = 8
    for moves, members in drawn.overview.paths:
        who = f"rank {members[0]}" if len(members) == 1 else f"ranks {compact(members)}"
        states = [moves[0][0]] + [dest for _, _, dest in moves] if moves else [State.UNINITIALIZED.value]
        blocks.append(f'<text x="6" y="{y + 12}" font-weight="bold">{_e(_cut(who, 120))}</text>')
        y += 20
        for i, state in enumerate(states):
            col, line = i % _PER_LINE, i // _PER_LINE
            bx = 6 + col * (_BOX_W + _GAP)
            by = y + line * (_BOX_H + 30)
            kind = " final" if state in finals else ""
            kind += " failed" if state == State.FAILED.value else ""
            blocks.append(
                f'<rect class="state{kind}" x="{bx}" y="{by}" width="{_BOX_W}" height="{_BOX_H}" rx="6">'
                f"<title>{_e(state)}</title></rect>"
            )
            blocks.append(f'<text x="{bx + _BOX_W / 2}" y="{by + 21}" text-anchor="middle">{_e(state)}</text>')
            if i + 1 < len(states):
                trigger = moves[i][1]
                if col + 1 < _PER_LINE:
                    x1, x2, ay = bx + _BOX_W, bx + _BOX_W + _GAP, by + _BOX_H / 2
                    blocks.append(f'<path class="edge" d="M{x1},{ay} L{x2 - 4},{ay}" marker-end="url(#{arrow})"/>')
                    blocks.append(
                        f'<text x="{(x1 + x2) / 2}" y="{ay - 5}" text-anchor="middle" font-size="9">'
                        f"{_e(_cut(trigger, 13))}<title>{_e(trigger)}</title></text>"
                    )
                else:  # down to the next line's first box
                    down_x, down_y = bx + _BOX_W / 2, by + _BOX_H
                    back_x, next_y = 6 + _BOX_W / 2, by + _BOX_H + 30
                    d = f"M{down_x},{down_y} L{down_x},{down_y + 12} L{back_x},{down_y + 12} L{back_x},{next_y - 4}"
                    blocks.append(
                        f'<path class="edge" d="{d}" marker-end="url(#{arrow})"><title>{_e(trigger)}</title></path>'
                    )
        lines = (len(states) + _PER_LINE - 1) // _PER_LINE
        y += lines * (_BOX_H + 30) + 6
    height = y + 4
    return "\n".join(
        [
            f'<svg class="path" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="100%"'
            f' style="max-width:{WIDTH}px" role="img" aria-label="{_e(drawn.label)}: the path through the states">',
            f"<style>{_CSS}</style>",
            f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"'
            ' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#1565c0"/></marker></defs>',
            *blocks,
            "</svg>",
        ]
    )
