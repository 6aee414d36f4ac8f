"""``show`` at 1,024 and 16,384 rank journals of 10 attempts each, side by side in one run: time, memory, open files.

For each world size W the journals are generated on disk in a temporary folder, rank
by rank (``lifecycle._tools.synthetic.failing_rank``, written by the real writer,
``JournalWriter``: the journal format byte for byte), read, and deleted: in every
attempt rank 1 fails at step 21 and the W − 1 others fail 60-80 ms later, each journaling
its failure notice and failure teardown; 31 records (about 8 KB) per rank and attempt.
Then, each in a fresh process of its own:

(a) show: ``show_main([folder, "--out", tmp])``, the function ``python -m lifecycle show``
    runs, stdout to ``os.devnull``, no Graphviz rendering (``dot`` hidden), under an
    open-files limit of ``NOFILE`` (``RLIMIT_NOFILE``, soft): its CPU seconds, its peak
    resident memory (``VmHWM``) and that less what the process held once imported, the
    most files it held open (counted at every ``open`` audit event: the entries of
    ``/proc/self/fd`` beyond those open when it started, the one being opened counted), the lines it printed;
(b) json: every line of every journal decoded with ``json.loads`` alone, the floor for
    anything that reads these files in Python (CPU seconds).

With ``--before REV``, (a) also runs on the code of that git revision (its ``lifecycle``
package, extracted to a temporary folder), under no open-files limit: what show cost
before it streamed. ``python bench/show_scale.py [--worlds 1024 16384] [--before REV]
[--json out.json]`` takes about 10 minutes here (most of it writing and decoding 1.3 GB of
16,384 ranks' journals) and needs about 1.5 GB of free disk; ``make bench`` renders the rows
stored in ``bench/show_scale_results.json`` without running it again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ATTEMPTS = 10
NOFILE = 64
"""The open-files limit show runs under here: far below the 16,384 journals it reads."""


def _peak_kib() -> int:
    """This process's peak resident memory so far, KiB (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _show_here(folder: str, out: str, nofile: int) -> None:
    """In this fresh process: ``show_main`` on ``folder`` (see the module doc, (a)); print its measures as JSON."""
    import contextlib

    from lifecycle._tools.show.main import show_main

    if nofile:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    base = len(os.listdir("/proc/self/fd")) - 1  # the standard streams and what the imports left open
    most = [0]

    def count(event: str, _args: Any) -> None:
        if event == "open":  # before the file opens: those open already, less the listing's own, and this one
            most[0] = max(most[0], len(os.listdir("/proc/self/fd")) - 1 - base + 1)

    sys.addaudithook(count)
    before = _peak_kib()
    os.environ["PATH"] = ""
    lines = 0

    class Counting:
        def write(self, text: str) -> int:
            nonlocal lines
            lines += text.count("\n")
            return len(text)

        def flush(self) -> None:
            pass

    with contextlib.redirect_stdout(Counting()):  # type: ignore[type-var]
        start, wall = time.process_time(), time.perf_counter()
        code = show_main([folder, "--out", out])
        took, wall = time.process_time() - start, time.perf_counter() - wall
    assert code == 0, f"show exited {code}"
    peak = _peak_kib()
    print(
        json.dumps(
            {"cpu_s": took, "wall_s": wall, "peak_mb": peak / 1024, "grew_mb": (peak - before) / 1024,
             "open_most": most[0], "lines": lines}
        )
    )  # fmt: skip


def _json_here(folder: str) -> None:
    """In this fresh process: decode every journal line in ``folder`` with ``json.loads``; print the CPU seconds."""
    start = time.process_time()
    for path in sorted(Path(folder).glob("rank*.jsonl")):
        with open(path, "rb") as file:
            for line in file:
                json.loads(line)
    print(json.dumps({"cpu_s": time.process_time() - start}))


def _fresh(args: list[str], code: Path | None = None) -> dict[str, Any]:
    """Run this script with ``args`` in a fresh interpreter (``lifecycle`` from ``code``, else this tree)."""
    env = {**os.environ, "PYTHONPATH": str(code if code is not None else ROOT)}
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True, timeout=1800, env=env
    )
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def _write(folder: Path, world: int) -> tuple[int, float]:
    """Write ``world`` ranks' journals of ``ATTEMPTS`` attempts into ``folder``, one rank at a time; records, MB."""
    from lifecycle._tools.show import synthetic

    records = 0
    for rank in range(world):
        rank_records = synthetic.failing_rank("bench", world, ATTEMPTS, rank)
        records += len(rank_records)
        synthetic.write(folder, {rank: rank_records})
    return records, sum(p.stat().st_size for p in folder.iterdir()) / 1e6


def measure(world: int, before: Path | None) -> dict[str, Any]:
    """One row: write the journals, run (a) and (b) (and (a) on the ``before`` code), delete the journals."""
    with tempfile.TemporaryDirectory(prefix="show-scale-") as tmp:
        folder = Path(tmp) / "journals"
        started = time.perf_counter()
        records, size = _write(folder, world)
        row: dict[str, Any] = {"world": world, "attempts": ATTEMPTS, "records": records, "mb": round(size)}
        row["write_s"] = round(time.perf_counter() - started, 1)
        show = _fresh(["--show-here", str(folder), str(Path(tmp) / "out"), str(NOFILE)])
        row["show"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in show.items()}
        row["json_cpu_s"] = round(_fresh(["--json-here", str(folder)])["cpu_s"], 3)
        if before is not None:
            old = _fresh(["--show-here", str(folder), str(Path(tmp) / "old"), "0"], before)
            row["before"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in old.items()}
        print(json.dumps(row), flush=True)
        return row


def _extract(rev: str, into: Path) -> Path:
    """The ``lifecycle`` package of git revision ``rev``, extracted under ``into``; the folder to put on the path."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "lifecycle"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


RESULTS = HERE / "show_scale_results.json"
"""The last run's rows (``--json``); ``make bench`` renders them (``stored_section``) without running again."""


def section(rows: list[dict[str, Any]], before: str = "") -> str:
    """The docs/benchmarks.md section of ``rows``."""
    lines = [
        f"### show at scale: W rank journals × {ATTEMPTS} attempts, each size in a fresh process, side by side in one"
        " run (bench/show_scale.py; CPU s)",
        "",
        "| W | records | MB on disk | (a) show | per rank (ms) | (b) json alone | (a)/(b) | peak RSS (MB) "
        f"| over its imports (MB) | files open at most (limit {NOFILE}) | lines printed |"
        + (" before: show | before: peak RSS over imports (MB) |" if any("before" in r for r in rows) else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if any("before" in r for r in rows) else ""),
    ]
    for r in rows:
        s = r["show"]
        cells = [
            f"{r['world']:,}",
            f"{r['records']:,}",
            f"{r['mb']:,}",
            f"{s['cpu_s']:.2f}",
            f"{s['cpu_s'] / r['world'] * 1000:.2f}",
            f"{r['json_cpu_s']:.2f}",
            f"{s['cpu_s'] / r['json_cpu_s']:.1f}",
            f"{s['peak_mb']:.0f}",
            f"{s['grew_mb']:.0f}",
            str(s["open_most"]),
            f"{s['lines']:,}",
        ]
        if "before" in r:
            cells += [f"{r['before']['cpu_s']:.2f}", f"{r['before']['grew_mb']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    by = {r["world"]: r for r in rows}
    small, big = min(by), max(by)
    ratio = (by[big]["show"]["cpu_s"] / big) / (by[small]["show"]["cpu_s"] / small)
    grew = by[big]["show"]["grew_mb"] - by[small]["show"]["grew_mb"]
    per_kb = grew * 1024 / ((big - small) * ATTEMPTS)
    opened = max(r["show"]["open_most"] for r in rows)
    text = (
        f"What this shows (issue 29, item 4): `python -m lifecycle show` on {big:,} ranks' journals of {ATTEMPTS}"
        f" attempts costs {ratio:.2f}× the CPU time per rank it costs on {small:,} (target: at most 4×), with"
        f" {'one journal file' if opened == 1 else f'{opened} files'} open at a time (the standard streams aside;"
        f" under a limit of {NOFILE} files). Of each rank and attempt it keeps its end as the verdict reads it and"
        " its part of the attempt's overview (start times, path through the states), and reads again the"
        " journals of the ranks the text and the charts show in full (the cause's, one of each group that ended"
        f" alike): its memory over its imports grows by {grew:.0f} MB from {small:,} to {big:,} ranks, about"
        f" {per_kb:.1f} KB a rank and attempt (the summary and the allocator's share of it), where holding the"
        " records took about 10 KB. The text timeline lists every rank up to 64 ranks an attempt, beyond that"
        " one rank of each group of ranks that ended alike (`--ranks` adds any), so the lines printed stay the"
        " same from 1,024 to 16,384 ranks."
    )
    if before and all("before" in r for r in rows):
        old = (by[big]["before"]["cpu_s"] / big) / (by[small]["before"]["cpu_s"] / small)
        text += (
            f" The before columns are the code of {before}, on the same journals in the same run: every record"
            f" held ({by[big]['before']['grew_mb']:,.0f} MB over its imports at {big:,} ranks), every rank's"
            f" timeline printed ({by[big]['before']['lines']:,} lines), {old:.2f}× the time per rank at {big:,}"
            " (listing a folder's journals compared every name with every journal: quadratic, fixed)."
        )
    lines += ["", text, ""]
    return "\n".join(lines)


def stored_section() -> str:
    """The section of the last run (``RESULTS``), for ``make bench``; a line saying so if there is none."""
    if not RESULTS.exists():
        return "### show at scale\n\nNot measured yet: run `python bench/show_scale.py --json " + str(RESULTS) + "`.\n"
    stored = json.loads(RESULTS.read_text(encoding="utf-8"))
    return section(stored["rows"], stored.get("before", ""))


def main(argv: list[str]) -> int:
    """Measure each world size in turn; print the section (and write the rows with ``--json``)."""
    if argv[:1] == ["--show-here"]:
        _show_here(argv[1], argv[2], int(argv[3]))
        return 0
    if argv[:1] == ["--json-here"]:
        _json_here(argv[1])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--before", help="a git revision whose show to run too (e.g. the commit before streaming)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="show-scale-code-") as code:
        before = _extract(args.before, Path(code)) if args.before else None
        rows = [measure(world, before) for world in args.worlds]
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "before": args.before or ""}, indent=1))
    print(section(rows, args.before or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
