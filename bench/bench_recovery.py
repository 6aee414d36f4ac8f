"""Recovery after each fault kind: ``demo --fault K --retry``, from the fault to the first step of the next attempt.

Two gloo ranks under torchrun on this machine (the demo as a user runs it), 60 steps,
a checkpoint every 10, the liveness monitor in kill mode looking every 0.25 s (2 s
floor); rank 1 faults at step 40 (``hang`` in its batch, where the monitor can name it;
the others after the step's compute). ``raise`` is retried in the same processes;
``crash``, ``stop``, ``hang`` and ``spin`` lose a process and torchrun restarts both
ranks (``--max-restarts``), which resume from step 30. Every number comes from the
journals:

- *fault*: for ``raise`` the failing rank's failure notice; otherwise the end of its last
  step before the fault (the fault fires within the next step, tens of ms later);
- *detected*: rank 0 (the survivor) takes the failure edge;
- *training again*: the first step of the next attempt starts (any rank);
- *steps lost*: steps trained before the fault that the next attempt trains again (the
  last step any rank finished, less the step it resumed from).

There is no baseline run: the table is a cost breakdown, not a ratio. A torchrun
restart pays the new processes' start-up (importing torch and megatron-core) and a new
rendezvous; an in-process retry pays neither.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import table

from lifecycle.journal import Failure, Record, TrainStep, Transition, read

KINDS = ("raise", "crash", "stop", "hang", "spin")
ROUNDS = 2
STEPS, FAIL_STEP, INTERVAL = 60, 40, 10


def run_once(kind: str, folder: Path) -> dict[str, float]:
    """One demo run with ``kind``; its timings in seconds and the steps lost."""
    phase = "batch" if kind == "hang" else "step"
    command = [
        sys.executable,
        *("-m", "lifecycle", "demo", "--steps", str(STEPS), "--fail-at", phase, "--fail-step", str(FAIL_STEP)),
        *("--checkpoint-interval", str(INTERVAL), "--eval-interval", "0", "--liveness-interval", "0.25"),
        *("--fault", kind, "--retry", "--journal-dir", str(folder)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"demo --fault {kind} --retry exited {done.returncode}:\n{done.stdout[-3000:]}")
    return measure(read([folder]), kind)


def measure(records: list[Record], kind: str) -> dict[str, float]:
    """The timings of the first attempt's fault and the next attempt's start (see the module docstring)."""
    before = [r for r in records if (r.origin.restart_count, r.origin.attempt) == (0, 0)]
    after = [r for r in records if (r.origin.restart_count, r.origin.attempt) != (0, 0)]
    if kind == "raise":
        fault = min(r.time for r in before if isinstance(r, Failure) and r.origin.rank == 1)
    else:
        fault = max(r.end or 0.0 for r in before if isinstance(r, TrainStep) and r.origin.rank == 1)
    detected = min(r.start for r in before if isinstance(r, Transition) and r.dest == "failed" and r.origin.rank == 0)
    steps_after = [r for r in after if isinstance(r, TrainStep)]
    again = min(r.start or 0.0 for r in steps_after)
    resumed = min(r.step for r in steps_after) - 1
    reached = max(r.step for r in before if isinstance(r, TrainStep))
    return {"detected": detected - fault, "again": again - fault, "lost": float(reached - resumed)}


def main() -> str:
    """Run every kind ``ROUNDS`` times, rotating; the table (median of the rounds)."""
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for round_ in range(ROUNDS):
            for kind in KINDS:
                results[kind].append(run_once(kind, Path(tmp) / f"{kind}-{round_}"))
    rows = []
    for kind in KINDS:
        runs = results[kind]
        path = "same processes" if kind == "raise" else "torchrun restart"
        rows.append(
            [
                kind,
                path,
                f"{statistics.median(r['detected'] for r in runs):.2f}",
                f"{statistics.median(r['again'] for r in runs):.1f}",
                f"{statistics.median(r['lost'] for r in runs):.0f}",
            ]
        )
    title = (
        f"Recovery: demo --fault K --retry (2 gloo ranks, fault at step {FAIL_STEP}, checkpoint every "
        f"{INTERVAL}, liveness looks every 0.25 s; median of {ROUNDS} rotating runs; s)"
    )
    header = ["fault", "recovered by", "fault → survivor fails", "fault → training again", "steps lost"]
    # Written from the last run (docs/benchmarks.md): re-read it when the numbers move.
    shows = (
        "What this shows: the time a failure costs before training resumes, per kind (docs/recovery.md). A "
        "raise is retried in the same processes: the survivor fails about 0.5 s after the fault (the failing "
        "rank waits up to two monitor intervals for a liveness verdict before it aborts its group) and trains"
        " again 2 s after it (the 0.5 s a rank waits for a launcher's stop, a rendezvous, the resume). A "
        "crash resets the survivor's collective at once; torchrun's restart then costs 8-14 s here, mostly "
        "new processes importing torch and megatron-core on 2 busy cores. A stopped, hung or spinning rank is "
        "named by its liveness monitor and killed about 2.5 s after the fault (the loop's 2 s floor deadline "
        "and a look or two), which resets the survivor at once; torchrun then restarts both. Steps lost: the 9 "
        "trained since the checkpoint at step 30."
    )
    return table(title, header, rows) + "\n" + shows + "\n"


if __name__ == "__main__":
    print(main())
