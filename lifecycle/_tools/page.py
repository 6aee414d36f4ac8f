"""``show --html PATH``: one self-contained HTML page of a run that opens offline.

Per attempt: the verdict, the gantt chart and the highlighted state diagram, then the
timeline. The page loads nothing from anywhere. Where the pinned ``mermaid`` npm
package is installed (``make mermaid`` puts it in ``tools/mermaid/node_modules``, or
``LIFECYCLE_MERMAID_JS`` names a ``mermaid.min.js``), its bundle is inlined and the
browser draws both diagrams; otherwise the page shows their Mermaid source in
``<pre>`` blocks (paste into any Mermaid viewer) next to the textual verdict and
timeline. A state diagram Graphviz rendered (``attempt<N>.svg``, when ``dot`` is
installed) is inlined as SVG either way.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BUNDLE = (
    Path(__file__).resolve().parents[2] / "tools" / "mermaid" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
)
"""Where ``make mermaid`` installs the pinned mermaid bundle, in a source checkout."""


@dataclass(frozen=True, slots=True)
class Section:
    """One attempt on the page: its label, verdict and timeline lines, Mermaid sources, and an SVG if rendered."""

    label: str
    verdict: Sequence[str]
    timeline: Sequence[str]
    gantt: str
    state: str
    svg: str | None = None


def mermaid_bundle() -> str | None:
    """The text of the mermaid bundle to inline: ``LIFECYCLE_MERMAID_JS`` if set, else ``BUNDLE``; None if absent."""
    given = os.environ.get("LIFECYCLE_MERMAID_JS")
    path = Path(given) if given else BUNDLE
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _inline_svg(svg: str) -> str:
    """An SVG document's ``<svg>`` element, its XML prolog and doctype dropped."""
    at = svg.find("<svg")
    return svg[at:] if at >= 0 else ""


def page(title: str, sections: Sequence[Section], bundle: str | None) -> str:
    """The page: ``sections`` in order; the diagrams drawn by the inlined ``bundle``, or shown as source without it."""
    esc = html.escape
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;margin:1em 2em}pre{background:#f6f6f6;padding:.5em;overflow-x:auto}"
        ".verdict{background:#fff3e0;border-left:4px solid #e65100}</style>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    if bundle is None:
        out.append(
            "<p>The mermaid bundle is not installed here (<code>make mermaid</code>), so the diagrams are shown"
            " as Mermaid source: paste one into any Mermaid viewer to draw it.</p>"
        )
    for section in sections:
        out.append(f"<h2>{esc(section.label)}</h2>")
        out.append('<h3>Verdict</h3><pre class="verdict">' + esc("\n".join(section.verdict)) + "</pre>")
        for heading, source in (("Timeline chart", section.gantt), ("Path taken", section.state)):
            out.append(f"<h3>{heading}</h3>")
            if heading == "Path taken" and section.svg:
                out.append(_inline_svg(section.svg))
            if bundle is not None:
                out.append(f'<pre class="mermaid">{esc(source)}</pre>')
            out.append(f"<details{'' if bundle is not None else ' open'}><summary>Mermaid source</summary>")
            out.append(f"<pre>{esc(source)}</pre></details>")
        out.append("<h3>Timeline</h3><pre>" + esc("\n".join(section.timeline)) + "</pre>")
    if bundle is not None:
        # The bundle is inlined: a "</script" inside it would end the element early.
        out.append("<script>" + bundle.replace("</script", "<\\/script") + "</script>")
        out.append("<script>mermaid.initialize({startOnLoad: true, securityLevel: 'strict'});</script>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
