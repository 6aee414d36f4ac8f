"""The GPU check: carry the wheels to a GPU host without a package index, run tests/gpu there, print a summary.

Two stacks of libraries, both run on the GPU host's own torch (2.11): ``ci`` (megatron-core
0.16.1, NVRx 0.4.1: ``make check``'s; ``tools/gpu-wheelhouse.txt``, ``build/gpu-wheelhouse``)
and ``newest`` (megatron-core 0.19.2, NVRx 0.7.0: ``make test-compat``'s;
``tools/gpu-wheelhouse-newest.txt``, ``build/gpu-wheelhouse-newest``). NVRx 0.7.0's wheel is
``manylinux_2_39`` only: ``run --stack newest`` refuses a host with an older glibc.

``python tools/gpu_check.py wheelhouse [--stack S] [--dest DIR]`` (``make gpu-wheelhouse``,
where the index is reachable): download the cp312 manylinux x86_64 wheels listed in the
stack's requirements (no dependency resolution: torch stays the host's), then
check that every requirement of every wheel but torch is in the folder and that the
folder is under 60 MiB.

``python3 tools/gpu_check.py run [--stack S] [--wheelhouse DIR]`` (``make gpu-check``, on the GPU
host, with its own ``python3`` and CUDA build of torch): make a virtual environment with
the host's site-packages visible (``--system-site-packages``: the host's torch, pytest,
pytest-timeout, hypothesis), install the wheels into it from the folder (the host's pip
with ``--no-index``, or, without pip, by unpacking them), run ``tests/gpu`` on one rank
per visible GPU, and print a table of what passed, failed or was not verified, with
the date, GPU, torch, CUDA and NCCL versions. The table is also written to
``build/gpu-check/summary.md`` (``ci``) or ``build/gpu-check-newest/summary.md``, ready for docs/howto.md ("On GPUs").

Standard library only, except ``packaging`` for the wheelhouse check.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
LIMIT_MIB = 60
CHECK_TIMEOUT_S = 300  # the whole pytest run; on one GPU its tests are bounded to 290 s together, even if they hang
HOST_PROVIDES = ("torch",)
"""Requirements the GPU host satisfies itself: never carried."""
TARGET = {  # the environment markers of the GPU hosts (Python 3.12, Linux x86_64, CPython)
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


class Stack(NamedTuple):
    """One set of library versions the GPU check runs: its pinned wheels, folders and the glibc its wheels need."""

    name: str
    requirements: Path
    wheelhouse: Path
    venv: Path
    results: Path
    platforms: tuple[str, ...]
    glibc: tuple[int, int]


STACKS = {
    "ci": Stack(
        "ci",
        REPO / "tools" / "gpu-wheelhouse.txt",
        REPO / "build" / "gpu-wheelhouse",
        REPO / "build" / "gpu-venv",
        REPO / "build" / "gpu-check",
        PLATFORMS,
        (2, 31),
    ),
    "newest": Stack(
        "newest",
        REPO / "tools" / "gpu-wheelhouse-newest.txt",
        REPO / "build" / "gpu-wheelhouse-newest",
        REPO / "build" / "gpu-venv-newest",
        REPO / "build" / "gpu-check-newest",
        ("manylinux_2_39_x86_64", *PLATFORMS),  # NVRx 0.7.0: manylinux_2_39 only
        (2, 39),
    ),
}
CI = STACKS["ci"]
REQUIREMENTS, WHEELHOUSE = CI.requirements, CI.wheelhouse  # the ci stack's, as before there were two


def host_glibc() -> tuple[int, int] | None:
    """This host's glibc as (major, minor), or None where it is not glibc."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    _, _, version = found.partition(" ")
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() else None


# -- the wheelhouse ------------------------------------------------------------------------


def pinned(stack: Stack = CI) -> list[str]:
    """The requirement lines of the stack's requirements file (default ``tools/gpu-wheelhouse.txt``)."""
    lines = (line.split("#")[0].strip() for line in stack.requirements.read_text().splitlines())
    return [line for line in lines if line]


def download(dest: Path, stack: Stack = CI) -> None:
    """Download the stack's pinned wheels for cp312 manylinux x86_64 into ``dest`` (emptied first); binary only."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    platforms = [arg for platform in stack.platforms for arg in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", *platforms, "--dest", str(dest),
        "-r", str(stack.requirements),
    ]  # fmt: skip
    subprocess.run(command, check=True)


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """``(name, version, Requires-Dist lines)`` read from a wheel's ``METADATA``."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        message = Parser().parsestr(archive.read(name).decode())
    return message["Name"], message["Version"], message.get_all("Requires-Dist") or []


def missing_requirements(folder: Path) -> list[str]:
    """Every requirement of a wheel in ``folder`` (for the GPU host's markers) that no wheel there satisfies.

    torch (the host's own) is not carried, so not required.
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wheels = {}
    for wheel in sorted(folder.glob("*.whl")):
        name, version, requires = wheel_metadata(wheel)
        wheels[canonicalize_name(name)] = (version, requires)
    missing = []
    for owner, (_, requires) in sorted(wheels.items()):
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(TARGET):
                continue
            name = canonicalize_name(requirement.name)
            if name in HOST_PROVIDES:
                continue
            have = wheels.get(name)
            if have is None or not requirement.specifier.contains(have[0], prereleases=True):
                missing.append(f"{owner} needs {line} (have {have[0] if have else 'none'})")
    return missing


def size_mib(folder: Path) -> float:
    """The total size of the wheels in ``folder``, in MiB."""
    return sum(wheel.stat().st_size for wheel in folder.glob("*.whl")) / 2**20


def wheelhouse(dest: Path, stack: Stack = CI) -> int:
    """Download the stack's wheels, then check completeness and size; print what is there. 0 if both hold."""
    download(dest, stack)
    wheels = sorted(dest.glob("*.whl"))
    for wheel in wheels:
        print(f"  {wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    total = size_mib(dest)
    print(f"{len(wheels)} wheels, {total:.1f} MiB in {dest}")
    missing = missing_requirements(dest)
    for line in missing:
        print(f"missing: {line}", file=sys.stderr)
    if total >= LIMIT_MIB:
        print(f"the wheelhouse is {total:.1f} MiB, over the {LIMIT_MIB} MiB limit", file=sys.stderr)
    return 1 if missing or total >= LIMIT_MIB else 0


# -- the check on the GPU host -------------------------------------------------------------


def make_venv(wheels: Path, stack: Stack = CI) -> Path:
    """A fresh venv seeing the host's site-packages, with the stack's wheels installed; return its python."""
    shutil.rmtree(stack.venv, ignore_errors=True)
    # --without-pip: the host may lack ensurepip (python3-venv); the host's pip is visible anyway.
    command = [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(stack.venv)]
    subprocess.run(command, check=True)
    python = stack.venv / "bin" / "python"
    has_pip = subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if has_pip:
        install = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links"]
        subprocess.run([*install, str(wheels), "-r", str(stack.requirements)], check=True)
    else:
        unpack(wheels, python, stack)
    return python


def unpack(wheels: Path, python: Path, stack: Stack = CI) -> None:
    """Without pip: unpack each pinned wheel into the venv's site-packages (a wheel is a zip of its files)."""
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    wanted = {line.split("==")[0].lower().replace("-", "_") for line in pinned(stack)}
    for wheel in sorted(wheels.glob("*.whl")):
        if wheel.name.split("-")[0].lower() in wanted:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(purelib)
    print(f"(no pip on this host: unpacked the wheels into {purelib})")


def host_facts(python: Path) -> dict[str, str]:
    """Python, torch, CUDA, NCCL, megatron-core and NVRx versions and the GPUs, read by ``python`` (the venv's)."""
    probe = (
        "import json, platform, torch\n"
        "from importlib.metadata import version\n"
        "n = torch.cuda.device_count()\n"
        "libraries = ', '.join(f'{d} {version(d)}' for d in ('megatron-core', 'nvidia-resiliency-ext'))\n"
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, 'libraries': libraries,\n"
        "  'cuda': str(torch.version.cuda), 'gpus': n,\n"
        "  'gpu': torch.cuda.get_device_name(0) if n else 'none',\n"
        "  'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if n else 'none'}))\n"
    )
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"python3 here cannot import torch, which the GPU check takes from the host:\n{found.stderr}")
    facts: dict[str, str] = json.loads(found.stdout)
    return facts


def summary(junit: Path, facts: dict[str, str], wall_s: float) -> str:
    """A Markdown table of every test in ``junit``: outcome (a skip's reason is its note) and duration."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, note = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, note = "FAILED", ((child.get("message") or "").splitlines() or [""])[0][:100]
            elif child.tag == "skipped":
                reason = child.get("message") or ""
                outcome = "not verified" if "not verified" in reason else "skipped"
                note = reason.removeprefix("Skipped: ")
        rows.append(f"| {case.get('name')} | {outcome} | {float(case.get('time') or 0):.1f} s | {note} |")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ranks = max(int(facts["gpus"]), 1)
    head = (
        f"GPU check ({facts.get('stack', 'ci')} stack: {facts.get('libraries', '')}), {date}: {facts['gpus']} x "
        f"{facts['gpu']}, {ranks} rank(s); Python {facts['python']}, torch {facts['torch']}, "
        f"CUDA {facts['cuda']}, NCCL {facts['nccl']}; {wall_s:.0f} s in all.\n\n"
        "| test | result | time | note |\n|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def run(wheels: Path, stack: Stack = CI) -> int:
    """Set up the stack's venv, run tests/gpu, print and write the summary. Exit status: pytest's (2: cannot run)."""
    started = time.monotonic()
    glibc = host_glibc()
    if glibc is None or glibc < stack.glibc:
        shown = ".".join(map(str, glibc)) if glibc else "not glibc"
        print(
            f"the {stack.name} stack's wheels need glibc {'.'.join(map(str, stack.glibc))} or newer and this host "
            f"has {shown}: run the ci stack here (the newest one's NVRx 0.7.0 is manylinux_2_39 only)",
            file=sys.stderr,
        )
        return 2
    if sys.version_info[:2] != (3, 12):
        version = ".".join(map(str, sys.version_info[:2]))
        print(
            f"the wheelhouse holds cp312 wheels, and this python3 is {version}: run it on Python 3.12", file=sys.stderr
        )
        return 2
    if not any(wheels.glob("*.whl")):
        print(f"no wheels in {wheels}: run `make gpu-wheelhouse` where the package index is reachable", file=sys.stderr)
        return 2
    python = make_venv(wheels, stack)
    facts = {**host_facts(python), "stack": stack.name}
    if int(facts["gpus"]) == 0:
        print("torch sees no CUDA device here: nothing to check", file=sys.stderr)
        return 2
    stack.results.mkdir(parents=True, exist_ok=True)
    junit = stack.results / "junit.xml"
    env = {
        **os.environ,
        "LIFECYCLE_GPU_CHECK": "1",
        "TORCH_CPP_LOG_LEVEL": "error",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    command = [python, "-m", "pytest", "tests/gpu", "-q", "-rA", f"--junitxml={junit}"]
    try:
        status = subprocess.run(command, cwd=REPO, env=env, timeout=CHECK_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"tests/gpu ran past {CHECK_TIMEOUT_S} s and was stopped", file=sys.stderr)
        status = 1
    if not junit.exists():
        return status or 1
    table = summary(junit, facts, time.monotonic() - started)
    (stack.results / "summary.md").write_text(table)
    print("\n" + table)
    return status


def main() -> int:
    """Parse the command line and run ``wheelhouse`` or ``run``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("wheelhouse", help="download and check the wheels")
    build.add_argument("--dest", type=Path, default=None, help="default: the stack's build/gpu-wheelhouse*")
    check = commands.add_parser("run", help="run the GPU check on this host")
    check.add_argument("--wheelhouse", type=Path, default=None, help="default: the stack's build/gpu-wheelhouse*")
    for command in (build, check):
        command.add_argument("--stack", choices=sorted(STACKS), default="ci", help="which libraries (default ci)")
    args = parser.parse_args()
    stack = STACKS[args.stack]
    if args.command == "wheelhouse":
        return wheelhouse(args.dest or stack.wheelhouse, stack)
    return run(args.wheelhouse or stack.wheelhouse, stack)


if __name__ == "__main__":
    sys.exit(main())
