"""The demo's options, each declared once (``OPTIONS``), and the configs every rank builds from them.

One ``Option`` gives a flag everything: its argparse entry (``parser``, whose ``--help``
ends with the exit codes ``ExitCode`` declares), its row in the docs (``options_table``), the config
field it sets (``demo_config``), the value it takes when not given (``derived``), the
fields whose errors it answers for (``flag_of``), and the flag it needs. The ranks get
the user's own arguments and parse them with the same parser, so a new option reaches
them without another edit: adding an option is adding an ``Option`` here (and, if it
drives the demo itself rather than a config field, reading it where it acts).

``check_options`` refuses a bad option set without touching the file system or the
network, naming the flag: the configs' own checks (a ``ConfigError``'s field mapped to
its flag), then the demo's rules that tie options together. No torch import here.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lifecycle._core.errors import ConfigError, check_number
from lifecycle._tools.cli import usage as _usage
from lifecycle._training.config import (
    DATA_FAULTS,
    STEPPED_PHASES,
    FaultKind,
    LivenessConfig,
    LivenessMode,
    OnNonfiniteLoss,
    OnSaveError,
    Phase,
    PretrainConfig,
)
from lifecycle._training.exits import NO_PROGRESS_LIMIT, ExitCode

DEFAULT_STEPS = 1000
"""Long enough to show training, short enough for a first look with 2 ranks on 2 CPU cores.

See docs/benchmarks.md, demo-default-steps: re-measure it when the demo's model changes.
"""

MICRO_BATCH_SIZE = 8

FIXED: Mapping[str, object] = {
    "distributed.backend": "gloo",
    "parallel.micro_batch_size": MICRO_BATCH_SIZE,
    "checkpoint.resume": True,
}
"""The config values the demo sets whatever the options: CPU ranks, its batch, resuming from the latest checkpoint."""


SAME_REQUEST_S = 0.2
"""Signals to the demo within this long of the first are that one stop request, not a second (shown in ``--help``).

One Ctrl-C can arrive several times: GNU ``timeout``, Slurm's ``srun`` and other
forwarding parents pass the terminal's SIGINT on to a process group that got it
already. A person cannot press Ctrl-C twice this fast; a second press after it kills.
"""


class UsageError(Exception):
    """A demo option that cannot work: ``flag`` names it, ``message`` says why (exit code 2)."""

    def __init__(self, flag: str, message: str) -> None:
        """Record the flag and the reason; ``str()`` is ``"<flag> <message>"``."""
        self.flag, self.message = flag, message
        super().__init__(f"{flag} {message}")


@dataclasses.dataclass(frozen=True, slots=True)
class Option:
    """One demo flag, declared once.

    ``field``: the config field it sets, as ``ConfigError`` names it
    (``training.iterations``; None: the flag drives the demo itself, like ``--retry``).
    ``derived``: the field's value when the flag is not given, from the parsed options
    (None: the config's own default). ``torchrun``: torchrun takes the value, and the
    ranks read it from the environment torchrun sets, so it is checked in the config
    but left out of the ranks' (the launcher may replace it: port 0 becomes a free
    one). ``answers_for``: other config fields whose errors this flag causes. ``needs``:
    a flag it is meaningless without, and why. The rest is argparse's: ``type`` (None
    for a switch), ``default``, ``metavar``, ``choices``, ``help``.
    """

    flag: str
    help: str
    field: str | None = None
    type: Callable[[str], Any] | None = int
    default: object = None
    metavar: str | None = "N"
    choices: tuple[str, ...] | None = None
    derived: Callable[[argparse.Namespace], object] | None = None
    torchrun: bool = False
    answers_for: tuple[str, ...] = ()
    needs: tuple[str, str] | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value under: ``--fail-at`` → ``fail_at``."""
        return _dest(self.flag)


def _dest(flag: str) -> str:
    """The attribute argparse stores ``flag``'s value under."""
    return flag.removeprefix("--").replace("-", "_")


def _part(n: int, most: int) -> Callable[[argparse.Namespace], int]:
    """A cadence of 1/``n`` of the steps, at least 1 and at most ``most`` steps apart."""
    return lambda options: max(1, min(most, options.steps // n))


# The default cadences' upper bounds: at the default 1000 steps (about a minute on 2 CPU
# ranks, docs/benchmarks.md, demo-default-steps) a log line every 50 steps is a few
# seconds apart, and a save every 250 steps bounds what a retry repeats, for any --steps.
LOG_EVERY_AT_MOST = 50
EVAL_EVERY_AT_MOST = 200
SAVE_EVERY_AT_MOST = 250


def _path(text: str) -> Path | str:
    """A folder flag's value: a ``Path``; an empty string stays ``""`` so that ``check_options`` refuses it.

    ``Path("")`` is the current folder: an unset shell variable (``--journal-dir "$DIR"``)
    would put journals and checkpoints there, and the next run would resume from them.
    """
    return Path(text) if text else ""


_FAULT = ("--fail-at", "there is no failure to place")


def _listed(words: list[str], last: str = "or") -> str:
    """``a, b or c``."""
    return f"{', '.join(words[:-1])} {last} {words[-1]}" if len(words) > 1 else "".join(words)


_DATA_FAULTS = " or ".join(kind.value for kind in DATA_FAULTS)


def _data_fault_phase(options: argparse.Namespace) -> str | None:
    """The phase of a ``--fault`` that has one of its own (``DATA_FAULTS``); None for the others."""
    kind = getattr(options, "fault", None)
    phases = {k.value: p.value for k, p in DATA_FAULTS.items()}
    return phases.get(kind) if isinstance(kind, str) else None


_STEPPED = ", ".join(phase.value for phase in Phase if phase in STEPPED_PHASES)
"""The phases ``--fail-step`` applies to, in ``Phase`` order (``batch`` first)."""

OPTIONS: tuple[Option, ...] = (
    Option("--nproc", "ranks to launch (default 2)", "distributed.world_size", default=2, torchrun=True),
    Option(
        "--tp",
        "tensor-parallel size: each rank holds 1/N of the model; must divide --nproc and the demo model's "
        "vocabulary and attention heads (default 1)",
        "parallel.tensor_model_parallel_size",
        default=1,
        answers_for=("model.vocab_size", "model.num_heads"),
    ),
    Option("--steps", f"training steps (default {DEFAULT_STEPS})", "training.iterations", default=DEFAULT_STEPS),
    Option(
        "--fail-at",
        f"inject a failure at PHASE: {_listed([phase.value for phase in Phase])} "
        f"(default with --fault {_DATA_FAULTS}: its own phase)",
        "fault.phase",
        type=str,
        metavar="PHASE",
        choices=tuple(p.value for p in Phase),
        derived=_data_fault_phase,
    ),
    Option(
        "--fail-rank",
        "rank that fails (default: the last rank)",
        "fault.rank",
        metavar="R",
        derived=lambda options: options.nproc - 1,
        needs=_FAULT,
    ),
    Option(
        "--fail-step",
        f"for {_STEPPED}: fire at the first such phase at or after step N, 1..--steps (default: half the steps)",
        "fault.step",
        derived=lambda options: max(1, options.steps // 2),
        needs=_FAULT,
    ),
    Option(
        "--fault",
        "what the injected failure does: raise an exception (default), crash (SIGKILL itself), "
        "stop (SIGSTOP itself), hang (sleep in the phase; at step, inside the model's forward), "
        "spin (C code holding the GIL); "
        "save-error (the rank's write of one save fails with ENOSPC), nan (the rank's loss of one step is NaN), "
        "desync (the rank skips one step's gradient all_reduce: its peers wait in one it never enters), "
        "desync-size (the rank all_reduces one step's gradients one element short; gloo aborts it)",
        "fault.kind",
        type=str,
        metavar="KIND",
        choices=tuple(k.value for k in FaultKind),
    ),
    Option(
        "--on-save-error",
        "a failed checkpoint save: continue (default: every rank drops it, it is recorded, training goes on; "
        "the attempt fails after 3 in a row), fail (the attempt fails)",
        "checkpoint.on_save_error",
        type=str,
        metavar="POLICY",
        choices=tuple(p.value for p in OnSaveError),
    ),
    Option(
        "--on-nonfinite-loss",
        "a step whose loss is NaN or infinite on a rank: fail (default), skip (no rank applies it; the "
        "attempt fails after 5 in a row), warn (apply it)",
        "training.on_nonfinite_loss",
        type=str,
        metavar="POLICY",
        choices=tuple(p.value for p in OnNonfiniteLoss),
    ),
    Option(
        "--liveness",
        "each rank's liveness monitor: kill (default: name a stopped, spinning, hung or dead rank, "
        "dump its stacks and kill it, so the others fail at once), report (name it only), off",
        "liveness.mode",
        type=str,
        default="kill",
        metavar="MODE",
        choices=tuple(m.value for m in LivenessMode),
    ),
    Option(
        "--liveness-interval",
        "seconds between a monitor's looks and beats (default 1)",
        "liveness.interval_s",
        type=float,
        metavar="S",
    ),
    Option(
        "--retry",
        "recover from the failure: pretrain again in the same processes after an exception, and torchrun "
        "restarts every rank from the last checkpoint after a lost process (--max-restarts)",
        type=None,
    ),
    Option(
        "--max-restarts",
        "torchrun restarts every rank after a lost one, at most N times (default 3 with --retry, else 0)",
    ),
    Option(
        "--fault-again",
        "inject the fault in every attempt, retries and restarts included (default: the first only); "
        f"after {NO_PROGRESS_LIMIT} attempts in a row without a new checkpoint the ranks exit "
        f"{ExitCode.DO_NOT_RESTART:d} (do not restart)",
        type=None,
    ),
    Option(
        "--checkpoint-dir",
        "checkpoints (default: checkpoints/ in the journal dir); the demo resumes from the latest one there, "
        "which must have been written at the same --tp",
        "checkpoint.dir",
        type=_path,
        metavar="DIR",
        derived=lambda options: options.journal_dir / "checkpoints",
    ),
    Option(
        "--checkpoint-interval",
        f"steps between saves (default: steps/4, at most {SAVE_EVERY_AT_MOST})",
        "checkpoint.interval",
        derived=_part(4, SAVE_EVERY_AT_MOST),
    ),
    Option(
        "--memory-copy",
        "also keep each rank's training state in node memory, every few steps (as many as keep its cost under a "
        "hundredth of a step's) and when a call fails, and resume from it when every rank can load the same step "
        "(a data-parallel replica's copy stands in for a crashed rank's): a restart then retrains fewer steps than "
        "since the last checkpoint, none after a raise or a crash here",
        "checkpoint.memory_copy",
        type=None,
    ),
    Option(
        "--journal-dir",
        "where journals and diagrams go; created if need be, it must hold no journals yet "
        "(default: a new temp dir, removed at exit unless --keep)",
        "journal_dir",
        type=_path,
        metavar="DIR",
    ),
    Option(
        "--keep",
        "keep the temporary folder the demo makes when --journal-dir is not given (default: removed at exit)",
        type=None,
    ),
    Option(
        "--eval-interval",
        f"steps between evaluations (default: steps/5, at most {EVAL_EVERY_AT_MOST})",
        "training.eval_interval",
        derived=_part(5, EVAL_EVERY_AT_MOST),
    ),
    Option(
        "--log-interval",
        f"steps between progress lines (default: steps/20, at most {LOG_EVERY_AT_MOST})",
        "training.log_interval",
        derived=_part(20, LOG_EVERY_AT_MOST),
    ),
    Option(
        "--master-addr",
        "rendezvous address; it must resolve (default 127.0.0.1)",
        "distributed.master_addr",
        type=str,
        default="127.0.0.1",
        metavar="ADDR",
        torchrun=True,
    ),
    Option(
        "--master-port",
        "rendezvous port, free here (default: a free one)",
        "distributed.master_port",
        default=0,
        metavar="PORT",
        torchrun=True,
    ),
    Option(
        "--timeout",
        "process-group timeout, and how long torchrun waits for the rendezvous, in seconds (default 30)",
        "distributed.timeout_s",
        type=float,
        default=30.0,
        metavar="S",
    ),
)
"""Every demo option, in ``--help`` order."""

FLAGS: Mapping[str, str] = {
    field: option.flag for option in OPTIONS for field in (option.field, *option.answers_for) if field is not None
}
"""The demo flag that sets, or answers for, each config field (derived from ``OPTIONS``)."""


def parser() -> argparse.ArgumentParser:
    """The demo's argument parser, built from ``OPTIONS`` (the launcher's and every rank's)."""
    made = argparse.ArgumentParser(
        prog="python -m lifecycle demo",
        description=(
            "Train a tiny causal LM on synthetic data with torchrun on CPU/gloo, then print each rank's "
            "lifecycle timeline and draw the path the run took. "
            "Ctrl-C once: every rank stops after the same step, saves and closes; twice: everything is killed "
            f"(signals within {SAME_REQUEST_S * 1000:.0f} ms of the first are that one request, e.g. a copy "
            "forwarded by timeout or srun)."
        ),
        epilog=_usage.exit_codes_text(),
        formatter_class=_usage.LineFormatter,
    )
    for option in OPTIONS:
        if option.type is None:
            made.add_argument(option.flag, action="store_true", help=option.help)
        else:
            made.add_argument(
                option.flag,
                type=option.type,
                default=option.default,
                metavar=option.metavar,
                choices=option.choices,
                help=option.help,
            )
    return made


def options_table() -> str:
    """docs/reference.md's table of the demo's options, one row per option as ``--help`` lists it (Markdown)."""
    actions = [action for action in parser()._actions if not isinstance(action, argparse._HelpAction)]
    rows = [(f"`{_usage.option_label(action)}`", str(action.help)) for action in actions]
    return _usage.markdown_table(("option", "meaning"), rows)


def flag_of(field: str) -> str:
    """The demo flag that sets config field ``field`` (the field itself if no flag does)."""
    return FLAGS.get(field, field)


def _sections() -> dict[str, type[Any]]:
    """PretrainConfig's sections by field name (``training`` → ``TrainingConfig``), from its annotations."""
    hints = typing.get_type_hints(PretrainConfig)
    found = {}
    for field in dataclasses.fields(PretrainConfig):
        for kind in typing.get_args(hints[field.name]) or (hints[field.name],):
            if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                found[field.name] = kind
    return found


_SECTIONS = _sections()


def demo_config(options: argparse.Namespace, *, for_ranks: bool = True) -> PretrainConfig:
    """The ``pretrain`` config of the first attempt, from the parsed ``options``; ``ConfigError`` naming a bad field.

    Each option with a ``field`` sets it: the given value, else its ``derived`` one,
    else the config's default; ``FIXED`` adds the demo's constants. A section that is
    None unless set (``fault``) is built only if an option given sets it. With
    ``for_ranks``, torchrun's options are left out (the ranks read torchrun's
    environment); without, they are in, to be checked. ``options.journal_dir`` must be set.
    """
    values: dict[str, object] = dict(FIXED)
    given: set[str] = set()
    for option in OPTIONS:
        if option.field is None or (for_ranks and option.torchrun):
            continue
        value = getattr(options, option.dest)
        if value is not None:
            given.add(option.field.partition(".")[0])
        elif option.derived is not None:
            value = option.derived(options)
        if value is not None:
            values[option.field] = str(value) if isinstance(value, Path) else value
    nested: dict[str, dict[str, object]] = {}
    top: dict[str, object] = {}
    for path, value in values.items():
        section, _, name = path.partition(".")
        if name:
            nested.setdefault(section, {})[name] = value
        else:
            top[section] = value
    for section, fields in nested.items():
        optional = next(f for f in dataclasses.fields(PretrainConfig) if f.name == section).default is None
        if not optional or section in given:
            top[section] = _SECTIONS[section](**fields)
    return PretrainConfig(**top)  # type: ignore[arg-type]


RETRY_RESTARTS = 3
"""torchrun's restarts with ``--retry`` and no ``--max-restarts``: ``exits.NO_PROGRESS_LIMIT``, the most that helps."""


def max_restarts(options: argparse.Namespace) -> int:
    """How often torchrun restarts the ranks: ``--max-restarts``, else ``RETRY_RESTARTS`` with ``--retry``, else 0."""
    if options.max_restarts is not None:
        return int(options.max_restarts)
    return RETRY_RESTARTS if options.retry else 0


def check_options(options: argparse.Namespace) -> PretrainConfig:
    """Refuse a bad option set before anything starts (nothing written, no network): ``UsageError`` naming the flag.

    The configs' own checks run on the configs the ranks will build (plus torchrun's
    options); then the demo's rules: ``--steps`` at least 1, a flag given without the
    one it needs, ``--fail-rank`` below ``--nproc``, ``--fail-step`` within ``--steps``
    and only for a stepped phase, no ``--fail-at eval`` without evaluations. Returns the
    checked config (folders not yet checked).
    """
    for option in OPTIONS:
        if option.type is _path and getattr(options, option.dest) == "":
            raise UsageError(
                option.flag,
                "is empty (an unset shell variable?): give a folder, or leave the flag out for the default",
            )
    for option in OPTIONS:
        if option.needs is not None and getattr(options, option.dest) is not None:
            needed, why = option.needs
            if getattr(options, _dest(needed)) is None and not (needed == _FAULT[0] and _data_fault_phase(options)):
                raise UsageError(option.flag, f"needs {needed} ({why})")
    placed = options.fail_at is not None or _data_fault_phase(options) is not None
    if options.fault is not None and not placed:
        raise UsageError("--fault", f"needs {_FAULT[0]} ({_FAULT[1]})")
    if options.fault_again and not placed:
        raise UsageError("--fault-again", f"needs {_FAULT[0]} ({_FAULT[1]})")
    if options.max_restarts is not None and options.max_restarts < 0:
        raise UsageError("--max-restarts", f"must be 0 or more, got {options.max_restarts}")
    # The folders are checked later, on the file system: any path will do here.
    placeholder = Path("journals") if options.journal_dir is None else options.journal_dir
    try:
        check_number("training.iterations", options.steps, at_least=1)  # the config allows 0: the demo needs one
        config = demo_config(argparse.Namespace(**{**vars(options), "journal_dir": placeholder}), for_ranks=False)
        # The model first: a --tp that splits no demo model is wrong on any --nproc, so say that, not the world size.
        _check_model_split(config, options.tp)
        if options.nproc % options.tp:  # the demo's layout is TP x DP: say so in its flags, not the config's fields
            raise UsageError(
                "--tp",
                f"{options.tp} does not divide --nproc {options.nproc}: the ranks form data-parallel copies of "
                f"{options.tp} tensor-parallel ranks each; use an --nproc that is a multiple of {options.tp}",
            )
        config.parallel.check_world(options.nproc)
    except ConfigError as exc:
        flag = flag_of(exc.field)
        if flag == "--checkpoint-dir" and options.checkpoint_dir is None:
            flag = "--journal-dir"  # the default checkpoint folder lies in the journal folder: the fault is there
        if exc.field == "liveness.floor_s":  # no demo flag sets the floor: the --timeout is what is too short
            floor = LivenessConfig().floor_s
            raise UsageError(
                "--timeout",
                f"{options.timeout:g}: not above the liveness floor ({floor:g} s, the "
                "least calibrated deadline): a peer's collective would time out before any culprit is named; "
                f"give a --timeout above {floor:g}, or --liveness off",
            ) from None
        raise UsageError(flag, exc.message) from None
    fault = config.fault
    if fault is None:
        return config
    if fault.rank >= options.nproc:
        raise UsageError(
            "--fail-rank", f"must be in 0..{options.nproc - 1} (--nproc {options.nproc}), got {fault.rank}"
        )
    if fault.phase in STEPPED_PHASES:
        if fault.step > options.steps:
            raise UsageError(
                "--fail-step",
                f"must be in 1..{options.steps} (--steps): at {fault.step} the failure would never fire",
            )
        if fault.phase is Phase.EVAL and config.training.eval_interval == 0:
            raise UsageError("--eval-interval", "is 0 (no evaluation), so --fail-at eval would never fire")
    elif options.fail_step is not None:
        stepped = ", ".join(sorted(p.value for p in STEPPED_PHASES))
        raise UsageError("--fail-step", f"only applies to --fail-at {stepped}, not {fault.phase.value}")
    return config


def _check_model_split(config: PretrainConfig, tp: int) -> None:
    """Refuse a ``--tp`` that does not divide the demo model's vocabulary and attention heads, naming both."""
    vocab, heads = config.model.vocab_size, config.model.num_heads
    try:
        config.model.check_tensor_parallel(tp)
    except ConfigError:
        parts = {"vocabulary": (vocab, "is"), "attention heads": (heads, "are")}
        uneven = [name for name, (value, _) in parts.items() if value % tp]
        even = [name for name in parts if name not in uneven]
        if len(uneven) == 2:
            said = f"vocabulary ({vocab}) and attention heads ({heads}) are not divisible by {tp}"
        else:
            value, verb = parts[uneven[0]]
            other, (other_value, other_verb) = even[0], parts[even[0]]
            said = f"{uneven[0]} ({value}) {verb} not divisible by {tp} (its {other}, {other_value}, {other_verb})"
        fits = [str(n) for n in range(1, heads + 1) if vocab % n == 0 and heads % n == 0]
        use = f"{', '.join(fits[:-1])} or {fits[-1]}" if len(fits) > 1 else fits[0]
        raise UsageError(
            "--tp", f"{tp}: the demo model's {said}; both are split across the tensor-parallel ranks: use {use}"
        ) from None
