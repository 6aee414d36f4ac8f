"""A monitor's deadlines per phase: a default until calibrated, then a multiple of the slowest sample.

Standard library only (the monitor runs as a script and imports it from its own folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOOP_PHASES = frozenset({"batch", "step", "callback"})
"""The phases of a training step: one deadline, calibrated on the steps' durations."""
WARMUP_STEPS = 2
"""Steps (occurrences of another phase) skipped before calibration (the first compile, allocate, warm caches)."""
CALIBRATED_AFTER = 3
"""Steps (occurrences) past warm-up the samples must stand for before a phase's deadline is calibrated."""


@dataclass
class Deadlines:
    """Deadline per phase: ``max(factor × slowest sample, floor_s)`` once calibrated; else ``default_deadline_s``.

    The loop past its warm-up steps and not yet calibrated: ``uncalibrated_s`` when set
    (the conviction floor: a rank that hangs in its first steps is still named in time).
    A step longer than a look is sampled alone, so the slowest single long step (a
    periodic heavy step, rank 0's work between steps) sets the deadline; steps shorter
    than a look are sampled by their mean, which the floor covers.

    ``deadlines`` (phase → seconds) override (the names are ``LivenessConfig``'s). The
    training loop's phases share the ``loop`` deadline, sampled per step; other phases
    are sampled per occurrence (``evaluation``, ``checkpoint``, ``finalize`` apart).
    """

    floor_s: float
    default_deadline_s: float
    deadlines: dict[str, float]
    factor: float = 5.0
    uncalibrated_s: float = 0.0
    """The loop's deadline past warm-up until calibrated (the conviction floor); 0: ``default_deadline_s``."""
    samples: dict[str, list[float]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # occurrences (steps, for the loop) seen, warm-up included
    covered: dict[str, int] = field(default_factory=dict)  # occurrences past warm-up the samples stand for

    def key(self, phase: str) -> str:
        """The calibration key of ``phase``: ``"loop"`` for a training step's phases."""
        return "loop" if phase in LOOP_PHASES else phase

    def sample(self, phase: str, seconds: float, count: int = 1) -> None:
        """Record ``seconds`` spent on each of ``count`` occurrences of ``phase`` (a mean: steps shorter than a look).

        Warm-up occurrences (the first ``WARMUP_STEPS``) are skipped: a sample that only
        covers them is dropped; one that reaches past them is kept (its mean, with a
        warm-up step in it, is only the more lenient) and counts for the occurrences past.
        """
        key = self.key(phase)
        before = self.seen.get(key, 0)
        self.seen[key] = before + count
        past = self.seen[key] - max(before, WARMUP_STEPS)
        if past > 0:
            self.samples.setdefault(key, []).append(seconds)
            self.covered[key] = self.covered.get(key, 0) + past

    def reached(self, phase: str, count: int) -> None:
        """The rank says it marked ``count`` occurrences of ``phase`` in all (``Position.steps``, for the loop): those
        this monitor did not see between two looks count as seen, unsampled. A monitor that first looks many steps
        into the loop (short steps, a look each interval) knows the warm-up is past."""
        key = self.key(phase)
        self.seen[key] = max(self.seen.get(key, 0), count)

    def of(self, phase: str) -> tuple[float, str]:
        """``phase``'s deadline and how it was set (``explicit``, ``calibrated``, ``floor``, ``default``)."""
        if phase in self.deadlines:
            return self.deadlines[phase], "explicit"
        found = self.samples.get(self.key(phase), [])
        if self.covered.get(self.key(phase), 0) >= CALIBRATED_AFTER:
            return max(self.factor * max(found), self.floor_s), "calibrated"
        if self.uncalibrated_s and self.key(phase) == "loop" and self.seen.get("loop", 0) >= WARMUP_STEPS:
            return max(self.uncalibrated_s, self.floor_s), "floor"
        return self.default_deadline_s, "default"
