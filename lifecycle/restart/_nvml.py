"""NVRx 0.5+'s NVML restart health checks on a host without NVML: turned off, with a warning that says so.

From NVRx 0.5 every ``inprocess.Wrapper`` built while ``LOCAL_RANK`` is set adds GPU,
NVLink and NIC health checks to the checks it runs before each restart. The GPU and
NVLink ones read the device through NVML (``libnvidia-ml.so.1``, part of the NVIDIA
driver). Without NVML (a CPU host: CI, a laptop, a gloo test suite under torchrun) the
GPU check raises ``HealthCheckError`` and the NVLink one ``NVMLError_LibraryNotFound`` at
the first restart, and the Wrapper stops instead of restarting: a restart loop that
ends for no stated reason. The NIC check finds no adapter and turns itself off.

Decision: where NVML does not load there is no GPU for those checks to watch, so the
Wrapper keeps every other check and drops those two, and a ``NvmlHealthChecksOff``
warning names them. Where NVML loads (every GPU host) nothing changes. NVRx 0.4 has
no such checks: nothing to do.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import warnings
from typing import Any

from nvidia_resiliency_ext.inprocess import Compose
from nvidia_resiliency_ext.inprocess import health_check as _nvrx_health

__all__ = ["NVML_LIBRARY", "NvmlHealthChecksOff", "drop_nvml_health_checks", "nvml_loads"]

NVML_LIBRARY = "libnvidia-ml.so.1"
"""The library NVML's Python bindings load (pynvml's name)."""

_NVML_CHECKS: tuple[type, ...] = tuple(
    check
    for check in (
        getattr(_nvrx_health, "ChainedGPUHealthCheck", None),
        getattr(_nvrx_health, "ChainedNVLHealthCheck", None),
    )
    if check is not None
)
"""NVRx's restart health checks that need NVML (none before NVRx 0.5)."""


class NvmlHealthChecksOff(RuntimeWarning):
    """A Wrapper's NVML health checks were turned off because NVML does not load on this host."""


def nvml_loads(library: str = NVML_LIBRARY) -> bool:
    """Whether ``library`` (default NVML's) loads in this process; loading it twice is harmless."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def drop_nvml_health_checks(wrapper: Any, *, nvml: bool | None = None) -> tuple[str, ...]:
    """Without NVML, remove NVRx's NVML checks from ``wrapper``'s restart health checks; return their names.

    ``nvml`` (default: ``nvml_loads()``) says whether NVML is available. With NVML, or
    when the Wrapper has no such check (NVRx 0.4, or ``LOCAL_RANK`` unset when it was
    built), the Wrapper is left as it is and the result is empty. Otherwise the other
    checks stay, in their order, and an ``NvmlHealthChecksOff`` warning names the
    removed ones and the NVRx version. Call it right after building the Wrapper.
    """
    checks = getattr(wrapper, "restart_health_check", None)
    if checks is None or not _NVML_CHECKS:
        return ()
    instances = list(checks.instances) if isinstance(checks, Compose) else [checks]
    dropped = [check for check in instances if isinstance(check, _NVML_CHECKS)]
    if not dropped or (nvml_loads() if nvml is None else nvml):
        return ()
    kept = [check for check in instances if not isinstance(check, _NVML_CHECKS)]
    wrapper.restart_health_check = Compose(*kept) if kept else None
    names = tuple(type(check).__name__ for check in dropped)
    warnings.warn(
        f"{NVML_LIBRARY} does not load on this host, so NVRx "
        f"{importlib.metadata.version('nvidia-resiliency-ext')}'s NVML restart health checks "
        f"({', '.join(names)}) would fail every restart; they are turned off for this Wrapper "
        "(its other health checks still run). On a GPU host NVML comes with the NVIDIA driver.",
        NvmlHealthChecksOff,
        stacklevel=3,
    )
    return names
