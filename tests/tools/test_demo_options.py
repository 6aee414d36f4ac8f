"""The demo refuses a bad option before torchrun starts, naming the flag; a rendezvous it cannot reach never hangs.

On the old launcher every case here started torchrun: the ranks died with a traceback
naming a config field (``timeout_s``), or trained fully before the folder was found
unusable, or (``--fail-step 0``, past ``--steps``) ran with another value than asked.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.launch import free_port, run_demo

from lifecycle._tools.demo.options import FLAGS, OPTIONS, UsageError, check_options, demo_config, parser

STARTED = " steps, rendezvous "
"""Printed by the launcher right before it starts torchrun."""


def refused(tmp_path: Path, *args: str) -> str:
    """Run the demo with ``args`` (journals: ``tmp_path/journal``); assert exit 2 before torchrun; the last line."""
    journal = tmp_path / "journal"
    started = time.monotonic()
    done = run_demo(*args, "--steps=20", f"--journal-dir={journal}", timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert time.monotonic() - started < 10, done.stdout
    assert STARTED not in done.stdout and "Traceback" not in done.stdout, done.stdout
    assert not (journal / "rank0.jsonl").is_file() or (journal / "rank0.jsonl").stat().st_size == 0
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--timeout=0"], "--timeout"),
        (["--timeout=-5"], "--timeout"),
        (["--timeout=nan"], "--timeout"),
        (["--checkpoint-interval=-1"], "--checkpoint-interval"),
        (["--eval-interval=-1"], "--eval-interval"),
        (["--log-interval=-1"], "--log-interval"),
        (["--fail-at=step", "--fail-step=-3"], "--fail-step"),
        (["--fail-at=step", "--fail-step=0"], "--fail-step"),  # old: silently replaced by the default
        (["--fail-at=step", "--fail-step=21"], "--fail-step"),  # old: never fired, and the run "succeeded"
        (["--fail-at=dist", "--fail-step=3"], "--fail-step"),
        (["--fail-step=3"], "--fail-step"),
        (["--fail-at=step", "--fail-rank=2"], "--fail-rank"),
        (["--fail-at=eval", "--eval-interval=0"], "--eval-interval"),
        (["--nproc=0"], "--nproc"),
        (["--tp=0"], "--tp"),
        (["--nproc=3", "--tp=3"], "--tp"),  # divides the world, not the model's 64-token vocabulary
        (["--checkpoint-dir="], "--checkpoint-dir"),  # old: the current folder, resumed from by the next run
        (["--timeout=inf"], "--timeout"),
        (["--timeout=2"], "--timeout"),  # not above the liveness floor (2 s): the culprit could never be named first
        (["--fail-at=step", "--fail-rank=-1"], "--fail-rank"),
        (["--fail-rank=0"], "--fail-rank"),
        (["--master-port=-1"], "--master-port"),
        (["--nproc=1000000"], "--nproc"),  # old: accepted, and drove the machine towards out-of-memory
        (["--master-port=70000"], "--master-port"),
        (["--master-addr="], "--master-addr"),
    ],
)
def test_a_bad_number_is_refused_naming_its_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    """A value no rank could run with: exit 2 before torchrun starts, the last line naming the flag."""
    assert refused(tmp_path, *args).startswith(f"demo: {flag} "), args


def test_an_empty_journal_dir_is_refused_not_taken_for_the_current_folder(tmp_path: Path) -> None:
    """``--journal-dir ""`` (an unset variable): exit 2 naming it, nothing written here (old: the current folder)."""
    done = run_demo("--journal-dir=", "--steps=20", timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert STARTED not in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("demo: --journal-dir is empty"), done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("tp", "named"), [(3, "vocabulary (64) and attention heads (4) are"), (8, "heads (4) are")])
def test_a_tensor_parallel_size_the_model_cannot_split_names_vocabulary_and_heads(tp: int, named: str) -> None:
    """--tp 3 on 3 ranks: the refusal names the vocabulary and the heads it must divide (old: "--tp 64 is not...")."""
    with pytest.raises(UsageError) as refused:
        check_options(parser().parse_args([f"--nproc={tp}", f"--tp={tp}"]))
    assert refused.value.flag == "--tp"
    message = str(refused.value)
    assert message.startswith(f"--tp {tp}: the demo model's ") and named in message, message
    assert "vocabulary (64)" in message or "vocabulary, 64" in message, message
    assert message.endswith("use 1, 2 or 4"), message


def test_a_tensor_parallel_size_is_checked_against_the_model_before_the_ranks() -> None:
    """--tp 3 on the default 2 ranks names the model (no --nproc fits it), not the config's world-size fields."""
    # Before issue 43 this said "tensor_model_parallel_size * ... = 3 does not divide world_size 2".
    with pytest.raises(UsageError) as refused:
        check_options(parser().parse_args(["--tp=3"]))
    assert str(refused.value).startswith("--tp 3: the demo model's vocabulary (64) and attention heads (4)"), refused


def test_a_tensor_parallel_size_that_does_not_divide_the_ranks_names_nproc() -> None:
    """--tp 2 on 3 ranks: the refusal names --tp and --nproc in the demo's words."""
    with pytest.raises(UsageError) as refused:
        check_options(parser().parse_args(["--nproc=3", "--tp=2"]))
    assert refused.value.flag == "--tp"
    assert str(refused.value).startswith("--tp 2 does not divide --nproc 3: "), refused


def _tp1_checkpoint(folder: Path) -> None:
    """A real committed checkpoint (step 5), written as ``pretrain`` writes one on one rank (TP1 PP1 DP1)."""
    import torch

    from lifecycle.checkpoint import AsyncCheckpointer
    from lifecycle.checkpoint.layout import ShardLayout

    AsyncCheckpointer(folder, layout=ShardLayout(tensor=1, data=1)).save_sync(5, {"w": torch.zeros(2)})


def test_a_checkpoint_folder_of_another_tensor_parallel_size_is_refused_before_torchrun(tmp_path: Path) -> None:
    """A TP1 --checkpoint-dir resumed with --tp 2: exit 2 naming the flag and both layouts (old: exit 1 per rank)."""
    _tp1_checkpoint(tmp_path / "ckpt")
    last = refused(tmp_path, "--nproc=2", "--tp=2", f"--checkpoint-dir={tmp_path / 'ckpt'}")
    assert last.startswith(f"demo: --checkpoint-dir {tmp_path / 'ckpt'} holds a checkpoint (step 5)"), last
    assert "written at TP1 PP1; this run is TP2 PP1 (--tp 2)" in last and last.endswith("or --tp 1"), last


def test_a_checkpoint_folder_of_the_same_tensor_size_is_accepted_whatever_the_data_size(tmp_path: Path) -> None:
    """The same TP1 checkpoint fits --tp 1 on any number of ranks (the data-parallel size may change)."""
    from lifecycle._tools.demo.main import check_checkpoint_layout

    _tp1_checkpoint(tmp_path / "ckpt")
    check_checkpoint_layout(tmp_path / "ckpt", 1)  # no refusal
    check_checkpoint_layout(tmp_path / "empty", 2)  # no checkpoint: nothing to check
    with pytest.raises(UsageError) as refused:
        check_checkpoint_layout(tmp_path / "ckpt", 2)
    assert refused.value.flag == "--checkpoint-dir"


def test_too_many_ranks_for_the_memory_says_what_a_rank_needs(tmp_path: Path) -> None:
    """--nproc beyond the available memory is refused with the memory a rank needs (measured) and what is free."""
    last = refused(tmp_path, "--nproc=1000000")
    assert "each rank needs about 400 MB" in last and "available" in last, last


def test_ranks_beyond_the_cores_are_a_warning_not_a_refusal(tmp_path: Path) -> None:
    """More ranks than CPU cores only warns (the run would go on; here a bad folder stops it next)."""
    cores = len(os.sched_getaffinity(0))
    done = run_demo(f"--nproc={cores + 1}", "--journal-dir=/proc/lifecycle-demo", timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert f"warning: --nproc {cores + 1} ranks share {cores} CPU cores" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("demo: --journal-dir "), done.stdout


@pytest.mark.parametrize("which", ["--journal-dir", "--checkpoint-dir"])
@pytest.mark.parametrize("kind", ["a file", "read-only", "not creatable"])
def test_an_unusable_folder_is_refused_before_anything_starts(tmp_path: Path, which: str, kind: str) -> None:
    """A journal or checkpoint folder that is a file, read-only or not creatable: exit 2 at once (old: late)."""
    target = {
        "a file": tmp_path / "file",
        "read-only": Path("/proc"),  # read-only even for root
        "not creatable": Path("/proc/lifecycle-demo/folder"),
    }[kind]
    (tmp_path / "file").write_text("not a folder\n")
    args = [f"{which}={target}", "--steps=20"]
    if which == "--checkpoint-dir":
        args.append(f"--journal-dir={tmp_path / 'journal'}")
    started = time.monotonic()
    done = run_demo(*args, timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert time.monotonic() - started < 10 and STARTED not in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"demo: {which} {target} "), done.stdout


def test_a_folder_that_holds_journals_is_refused(tmp_path: Path) -> None:
    """A journal folder that already holds rank journals is refused: the verdict must be this run's."""
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "rank0.jsonl").write_text("")
    assert refused(tmp_path).startswith("demo: --journal-dir "), "its own rank0.jsonl made it refuse"


@pytest.mark.parametrize("port", [[], ["--master-port=29613"]])
def test_an_address_that_does_not_resolve_is_refused_at_once(tmp_path: Path, port: list[str]) -> None:
    """An unresolvable --master-addr: exit 2 naming it (old: a gaierror traceback, or a hang of over 700 s)."""
    last = refused(tmp_path, "--master-addr=no.such.host.invalid", *port)
    assert last.startswith("demo: --master-addr 'no.such.host.invalid' does not resolve"), last


def test_a_port_in_use_is_refused_naming_it(tmp_path: Path) -> None:
    """An explicit --master-port that something listens on here: exit 2 naming it (old: torchrun's traceback)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        last = refused(tmp_path, f"--master-port={port}")
    assert last.startswith(f"demo: --master-port {port} is in use"), last


@pytest.mark.timeout(90)
def test_an_unreachable_rendezvous_fails_within_the_timeout_naming_the_address(tmp_path: Path) -> None:
    """An address that resolves but is not this machine's: the run fails within --timeout plus start-up, naming it.

    192.0.2.99 (TEST-NET-1, documentation only) is no host here. The old launcher passed
    torchrun no rendezvous timeout: its default is 15 minutes (without --master-port it
    failed at once, with a traceback, binding a free port on that address).
    """
    journal = tmp_path / "journal"
    args = ["--master-addr=192.0.2.99", f"--master-port={free_port()}", "--timeout=3", f"--journal-dir={journal}"]
    started = time.monotonic()
    done = run_demo(*args, timeout=80, cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout
    assert elapsed < 40, (elapsed, done.stdout[-3000:])
    assert "--master-addr 192.0.2.99 (192.0.2.99) is not an address of this machine" in done.stdout, done.stdout
    # --timeout 3 puts the conviction floor (1 s) at the 1 s interval: not provably bad, so a warning, in demo words
    assert "demo: warning: --liveness-interval 1 is not below the conviction floor (1 s" in done.stdout, done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("demo: FAILED") and "192.0.2.99:" in last, last


def _value_for(field: str) -> tuple[str, Any]:
    """A value a flag can be given that differs from every default, and the config value it becomes."""
    if field.endswith("dir"):
        return "/tmp/elsewhere", "/tmp/elsewhere"
    if field == "distributed.master_addr":
        return "localhost", "localhost"
    if field == "fault.phase":
        return "checkpoint", "checkpoint"
    if field == "fault.kind":
        return "spin", "spin"
    if field == "liveness.mode":
        return "report", "report"
    if field == "checkpoint.on_save_error":
        return "fail", "fail"
    if field == "training.on_nonfinite_loss":
        return "skip", "skip"
    if field == "liveness.interval_s":
        return "0.5", 0.5
    if field == "distributed.timeout_s":
        return "7.5", 7.5
    return "3", 3


def _config_value(config: Any, field: str) -> Any:
    """The value at dotted ``field`` of ``config``."""
    for name in field.split("."):
        config = getattr(config, name)
    return config


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.field], ids=lambda o: o.flag)
def test_every_option_reaches_its_config_field(option: Any) -> None:
    """Each declared option, given on the command line, sets its field in the config a rank builds (or the checked one).

    Derived from ``OPTIONS``: an option added there is checked here with no edit.
    """
    given, wanted = _value_for(option.field)
    if option.type is None:  # a switch: given alone, it sets its field
        given, wanted = "", True
    argv = ["--journal-dir=/tmp/journals", "--steps=12", "--fail-at=step", f"{option.flag}={given}".rstrip("=")]
    options = parser().parse_args(argv)
    config = demo_config(options, for_ranks=not option.torchrun)
    assert _config_value(config, option.field) == wanted


def test_torchrun_options_stay_out_of_the_ranks_config() -> None:
    """--nproc, --master-addr, --master-port go to torchrun: a rank reads them from its environment, not its config."""
    options = parser().parse_args(["--journal-dir=/tmp/journals", "--master-port=0", "--nproc=4"])
    ranks = demo_config(options).distributed
    assert (ranks.world_size, ranks.master_addr, ranks.master_port) == (None, None, None)
    checked = demo_config(options, for_ranks=False).distributed
    assert (checked.world_size, checked.master_addr, checked.master_port) == (4, "127.0.0.1", 0)


def test_defaults_derive_from_the_other_options() -> None:
    """Not given: a fault on the last rank at half the steps; a save every steps/4, an eval steps/5, a log steps/20."""
    options = parser().parse_args(["--journal-dir=/tmp/j", "--nproc=4", "--steps=40", "--fail-at=step"])
    config = check_options(options)
    assert (config.fault is not None) and (config.fault.rank, config.fault.step) == (3, 20)
    assert (config.checkpoint.interval, config.training.eval_interval, config.training.log_interval) == (10, 8, 2)
    assert config.checkpoint.dir == "/tmp/j/checkpoints" and config.checkpoint.resume
    assert demo_config(parser().parse_args(["--journal-dir=/tmp/j"])).fault is None


def test_default_cadences_stay_at_a_human_pace_for_any_steps() -> None:
    """A long run still logs every 50 steps, evaluates every 200 and saves every 250 (old: steps/20, /5, /4)."""
    config = check_options(parser().parse_args(["--journal-dir=/tmp/j", "--steps=100000"]))
    assert (config.checkpoint.interval, config.training.eval_interval, config.training.log_interval) == (250, 200, 50)


def test_zero_steps_are_refused_naming_the_flag() -> None:
    """--steps 0 is refused (the config allows 0 iterations; the demo needs a step to show)."""
    with pytest.raises(UsageError) as refused:
        check_options(parser().parse_args(["--steps=0"]))
    assert refused.value.flag == "--steps"


def test_every_flag_maps_from_its_field_and_every_config_field_error_names_a_flag() -> None:
    """FLAGS is derived from OPTIONS: each option's field (and the fields it answers for) maps to its flag."""
    for option in OPTIONS:
        for field in (option.field, *option.answers_for):
            if field is not None:
                assert FLAGS[field] == option.flag
    assert set(vars(parser().parse_args([]))) == {option.dest for option in OPTIONS}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
