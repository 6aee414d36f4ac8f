"""One rank's long journal: what ``show`` must read in bounded memory and time (issue 37, item 4).

Writes ``<folder>/rank0.jsonl``: one rank's ``pretrain`` call of ``--steps`` training
steps (default 700,000: about 180 MB), as ``lifecycle._tools.show.synthetic.rank_call``
builds it (a start, the moves up to ``training``, the steps, the success teardown and its
end), written by the real writer (``JournalWriter``), with an evaluation after every
``--eval-every`` steps (default 1,000). Then, with ``--measure``, runs
``python -m lifecycle show <folder> --out <tmp>`` in a fresh process, stdout to
``os.devnull``, and prints its wall and CPU time, its peak resident memory (``VmHWM``) and that
less what the process held once ``show`` was imported. ``docs/benchmarks.md`` has the
figures ("show on one long journal").

``python bench/long_journal.py FOLDER [--steps N] [--eval-every K] [--measure [--code DIR] [--no-write]]``
(``--code DIR``: measure the ``lifecycle`` package in DIR, e.g. an older revision's; ``--no-write``: the journal
already in FOLDER)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from lifecycle._tools.show.synthetic import STEP_S, rank_call  # noqa: E402
from lifecycle.journal import Eval, JournalWriter, Origin, RunStart, TrainStep, journal_path  # noqa: E402


def write(folder: Path, steps: int, eval_every: int) -> Path:
    """Write the long journal into ``folder`` (replacing one there); return its path."""
    origin = Origin("torchrun-node-0001.cluster:29500", 0, 0, "ordinary", 0)  # a long run id, as torchrun makes
    records = rank_call(origin, 1, 1_764_000_000.0, steps=steps)
    path = journal_path(folder, 0)
    folder.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    first = records[0]
    assert isinstance(first, RunStart)
    with JournalWriter(path, first) as writer:
        for record in records[1:]:
            writer.write(record)
            if isinstance(record, TrainStep) and eval_every and record.step % eval_every == 0:
                assert record.end is not None
                writer.write(Eval(origin=origin, step=record.step, loss=record.loss, start=record.end,
                                  end=record.end + STEP_S / 10))  # fmt: skip
    return path


_MEASURE = """
import json, os, sys, time
from pathlib import Path
def peak():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
from lifecycle._tools.show.main import show_main
imported = peak()
start, cpu = time.perf_counter(), time.process_time()
with open(os.devnull, "w") as devnull:
    sys.stdout = devnull
    code = show_main([sys.argv[1], "--out", sys.argv[2]])
    sys.stdout = sys.__stdout__
print(json.dumps({"code": code, "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
                  "peak_mb": peak() / 1024,
                  "imports_mb": imported / 1024}))
"""


def measure(folder: Path, code: Path = ROOT) -> dict[str, float]:
    """``show`` on ``folder`` in a fresh process (``dot`` hidden), of the ``lifecycle`` package in ``code``: exit
    code, wall and CPU seconds, peak MB, the imports' MB and the peak over them."""
    with tempfile.TemporaryDirectory() as out:
        env = os.environ | {"PATH": "/nonexistent", "PYTHONPATH": str(code)}
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(folder.resolve()), out],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=code,  # "-c" puts the working folder first on sys.path
        )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    figures["over_imports_mb"] = figures["peak_mb"] - figures["imports_mb"]
    return figures


def main() -> None:
    """Write the journal; with ``--measure``, measure ``show`` on it and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=700_000)
    parser.add_argument("--eval-every", type=int, default=1_000)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--code", type=Path, default=ROOT, help="measure the lifecycle package in this folder")
    parser.add_argument("--no-write", action="store_true", help="measure the journal already in FOLDER")
    args = parser.parse_args()
    if not args.no_write:
        started = time.perf_counter()
        path = write(args.folder, args.steps, args.eval_every)
        print(f"wrote {path}: {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - started:.0f} s")
    if args.measure:
        print(json.dumps(measure(args.folder, args.code)))


if __name__ == "__main__":
    main()
