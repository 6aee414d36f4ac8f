"""``show --html PATH``: one self-contained HTML page of a run that opens offline.

Per attempt: the verdict (its first line the cause, lines wrapped, never cut), the
timeline and the path through the states as SVG that lifecycle draws itself
(``lifecycle._tools.show.svg``: no npm, no Graphviz, no script, nothing loaded from
anywhere), then the textual timeline. The Mermaid sources of both diagrams stay on the
page, folded, for pasting into Markdown (GitHub draws them there); ``show`` writes them
as files too. The page carries no script: the mermaid bundle that ``make mermaid``
installs is only for checking the Mermaid sources parse (``tests/tools/test_mermaid_parse.py``).

The page's width: every block wraps or scales (``pre`` blocks wrap their lines, the SVG
pictures take the width they are given, up to ``svg.WIDTH``), so nothing is wider than
a 1,400-pixel window.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Section:
    """One attempt on the page: its label, verdict and timeline lines, its two pictures (SVG), Mermaid sources."""

    label: str
    verdict: Sequence[str]
    timeline: Sequence[str]
    timeline_svg: str
    path_svg: str
    gantt: str
    state: str


_STYLE = (
    "body{font-family:sans-serif;margin:1em 2em;max-width:1300px}"
    "pre{background:#f6f6f6;padding:.5em;white-space:pre-wrap;overflow-wrap:anywhere}"
    ".verdict{background:#fff3e0;border-left:4px solid #e65100}"
    ".verdict .cause{color:#b71c1c;font-weight:bold}"
    "figure{margin:.5em 0}svg{display:block;height:auto}"
    "details{margin:.3em 0}"
)


def page(title: str, sections: Sequence[Section]) -> str:
    """The page: ``sections`` in order, each its verdict, pictures, Mermaid sources (folded) and timeline."""
    esc = html.escape
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    for section in sections:
        out.append(f'<section class="attempt"><h2>{esc(section.label)}</h2>')
        lines = list(section.verdict)
        head = f'<span class="cause">{esc(lines[0])}</span>' if lines else ""
        rest = "".join("\n" + esc(line) for line in lines[1:])
        out.append(f'<h3>Verdict</h3><pre class="verdict">{head}{rest}</pre>')
        out.append(f'<h3>Timeline chart</h3><figure class="timeline">{section.timeline_svg}</figure>')
        out.append(f'<h3>Path taken</h3><figure class="path">{section.path_svg}</figure>')
        out.append("<details><summary>Mermaid sources (for Markdown)</summary>")
        out.append(f"<pre>{esc(section.gantt)}</pre><pre>{esc(section.state)}</pre></details>")
        out.append("<h3>Timeline</h3><pre>" + esc("\n".join(section.timeline)) + "</pre></section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
