"""NVRx 0.5+'s NVML restart health checks: turned off with a warning where NVML does not load, kept where it does.

The checks exist only from NVRx 0.5 (``make test-compat`` installs 0.7.0; ``make venv``
0.4.1, where the tests that need them skip and the one that pins "nothing changes" runs).
The 2-rank restarts in ``test_restart.py`` set ``LOCAL_RANK``, so on 0.5+ they pass only
because of this handling.
"""

from __future__ import annotations

import importlib.metadata
import warnings

import pytest
from packaging.version import Version

from lifecycle import restart
from lifecycle.restart._nvml import drop_nvml_health_checks, nvml_loads

NVRX = Version(importlib.metadata.version("nvidia-resiliency-ext"))
NVML_CHECKS = {"ChainedGPUHealthCheck", "ChainedNVLHealthCheck"}

needs_nvml_checks = pytest.mark.skipif(Version("0.5") > NVRX, reason=f"NVRx {NVRX} has no NVML health checks")


def restart_checks(wrapper: object) -> list[str]:
    """The class names of the checks ``wrapper`` runs before a restart, in order."""
    checks = getattr(wrapper, "restart_health_check", None)
    if checks is None:
        return []
    return [type(check).__name__ for check in getattr(checks, "instances", [checks])]


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment torchrun gives rank 0: ``LOCAL_RANK`` is what makes NVRx 0.5+ add its NVML checks."""
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("LOCAL_RANK", "0")


@needs_nvml_checks
@pytest.mark.usefixtures("torchrun_env")
def test_without_nvml_the_wrapper_drops_its_nvml_checks_and_warns() -> None:
    """No NVML here: make_wrapper keeps NVRx's NIC check, removes the GPU and NVLink ones, and says so."""
    if nvml_loads():
        pytest.skip("NVML loads on this host: the checks stay (test_with_nvml_the_wrapper_keeps_every_check)")
    with pytest.warns(restart.NvmlHealthChecksOff, match=r"ChainedGPUHealthCheck, ChainedNVLHealthCheck") as caught:
        wrapper = restart.make_wrapper(max_restarts=1)
    assert "libnvidia-ml.so.1 does not load" in str(caught[0].message)
    assert str(NVRX) in str(caught[0].message)
    assert restart_checks(wrapper) == ["ChainedNicHealthCheck"]


@needs_nvml_checks
@pytest.mark.usefixtures("torchrun_env")
def test_with_nvml_the_wrapper_keeps_every_check() -> None:
    """Where NVML is available nothing is dropped and nothing is said."""
    wrapper = restart.make_wrapper(max_restarts=1)
    if not nvml_loads():
        # Built here without NVML: put the checks back as NVRx made them, then decide as a GPU host would.
        wrapper._construct_restart_health_check()
    before = restart_checks(wrapper)
    assert set(before) >= NVML_CHECKS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert drop_nvml_health_checks(wrapper, nvml=True) == ()
    assert restart_checks(wrapper) == before


@needs_nvml_checks
@pytest.mark.usefixtures("torchrun_env")
def test_the_callers_own_health_check_survives_the_drop() -> None:
    """A health check the caller passes still runs before a restart after the NVML ones are removed."""
    from nvidia_resiliency_ext.inprocess.health_check import FaultCounter

    wrapper = restart.make_wrapper(max_restarts=1, health_check=FaultCounter())
    wrapper._construct_restart_health_check()
    with pytest.warns(restart.NvmlHealthChecksOff):
        dropped = drop_nvml_health_checks(wrapper, nvml=False)
    assert set(dropped) == NVML_CHECKS
    assert restart_checks(wrapper) == ["FaultCounter", "ChainedNicHealthCheck"]


@pytest.mark.usefixtures("torchrun_env")
def test_a_wrapper_without_nvml_checks_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRx 0.4, or LOCAL_RANK unset on 0.5+: no NVML check, so no warning and no change."""
    if Version("0.5") <= NVRX:
        monkeypatch.delenv("LOCAL_RANK")
    with warnings.catch_warnings():
        warnings.simplefilter("error", restart.NvmlHealthChecksOff)
        wrapper = restart.make_wrapper(max_restarts=1)
    assert not NVML_CHECKS & set(restart_checks(wrapper))
    assert drop_nvml_health_checks(wrapper, nvml=False) == ()
