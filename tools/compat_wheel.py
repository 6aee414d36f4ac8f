"""Fetch one manylinux_2_39 wheel and re-tag it linux_x86_64, for the compat test environment only.

Usage: python tools/compat_wheel.py nvidia-resiliency-ext==0.7.0 build/compat-wheels

Why: NVRx 0.5 and later publish only manylinux_2_39 wheels, so on a glibc 2.36 host pip silently
picks 0.4.1. 0.7.0's one native module (``nvrx_cupti_module``, the CUPTI straggler profiler) asks for
glibc 2.32, GLIBCXX_3.4.32 and libcupti.so.13; the in-process Wrapper lifecycle drives never loads it.
The re-tagged wheel claims no manylinux policy (``linux_x86_64``) and stays in ``build/``: it is a
test environment's stand-in, never something to publish. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

SOURCE_PLATFORM = "manylinux_2_39_x86_64"
TARGET_PLATFORM = "linux_x86_64"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def retag(wheel: Path, out_dir: Path) -> Path:
    """Write a copy of ``wheel`` tagged TARGET_PLATFORM into ``out_dir`` (WHEEL and RECORD rewritten); return it."""
    if SOURCE_PLATFORM not in wheel.name:
        raise SystemExit(f"{wheel.name}: expected a {SOURCE_PLATFORM} wheel")
    target = out_dir / wheel.name.replace(SOURCE_PLATFORM, TARGET_PLATFORM)
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        wheel_meta = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        new_wheel_meta = src.read(wheel_meta).decode().replace(SOURCE_PLATFORM, TARGET_PLATFORM).encode()
        rows = []
        for line in src.read(record).decode().splitlines():
            path = line.split(",", 1)[0]
            rows.append(
                f"{wheel_meta},{_record_hash(new_wheel_meta)},{len(new_wheel_meta)}" if path == wheel_meta else line
            )
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename == wheel_meta:
                    dst.writestr(info, new_wheel_meta)
                elif info.filename == record:
                    dst.writestr(info, "\n".join(rows) + "\n")
                else:
                    dst.writestr(info, src.read(info))
    return target


def main(argv: list[str]) -> int:
    """Download ``argv[0]`` (a pinned requirement) for cp312 and write its re-tagged wheel into ``argv[1]``."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    requirement, out = argv
    out_dir = Path(out)
    download = out_dir / "download"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"),
            *("--platform", SOURCE_PLATFORM, "--python-version", "3.12", "--dest", str(download), requirement),
        ],
        check=True,
    )
    (wheel,) = download.glob("*.whl")
    print(f"compat_wheel: {retag(wheel, out_dir).name} (re-tagged from {wheel.name}; test env only)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
