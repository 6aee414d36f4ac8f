"""The pytest plugin's factory fixtures: sessions on real ``TorchActions``, Megatron-core parallel state.

Both serve the fixtures of ``lifecycle.testing.pytest_plugin`` and the ranks of a
``world`` test alike. A factory makes as many as the test asks for and ``close`` tears
down every one still live, whatever happened: with the failure plan (rank-local, no
barrier, no collective), so a rank whose peer failed never waits on it. torch and
megatron-core are imported on the first call, not before.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lifecycle._core.errors import LifecycleError

if TYPE_CHECKING:
    from lifecycle._core.session import Session
    from lifecycle._torch.config import DistributedConfig, ParallelConfig

__all__ = ["GROUP_TIMEOUT_ENV", "FixtureEnded", "MegatronParallelFactory", "SessionFactory"]

GROUP_TIMEOUT_ENV = "LIFECYCLE_TEST_GROUP_TIMEOUT"
"""Seconds: the group timeout of a fixture's default configuration (a ``world`` rank sets it; default 30)."""
_DEFAULT_TIMEOUT_S = 30.0


class FixtureEnded(LifecycleError):
    """Why a fixture's session took the failure edge: the test ended while the session was still live."""


def default_distributed() -> DistributedConfig:
    """gloo on the world the environment describes (a ``world`` rank sets it), else a world of one on loopback."""
    from lifecycle._torch.config import DistributedConfig

    timeout_s = float(os.environ.get(GROUP_TIMEOUT_ENV) or _DEFAULT_TIMEOUT_S)
    if os.environ.get("WORLD_SIZE"):
        return DistributedConfig(backend="gloo", timeout_s=timeout_s)
    return DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=0, timeout_s=timeout_s)


class SessionFactory:
    """``factory(distributed=None, parallel=None, **session_options)`` → a new ``Session`` on real ``TorchActions``.

    ``distributed`` None: ``default_distributed()``; ``parallel`` None: ``ParallelConfig()``;
    ``session_options`` go to ``Session`` (``label``, ``restart_mode``, ``iteration``). The
    session is not started: the test drives it (``with factory() as session: ...``).
    """

    def __init__(self) -> None:
        """Nothing made yet."""
        self.made: list[Session] = []

    def __call__(
        self, distributed: DistributedConfig | None = None, parallel: ParallelConfig | None = None, **options: Any
    ) -> Session:
        """Make a session (see the class docstring); it is torn down by ``close`` if the test leaves it live."""
        from lifecycle._core.session import Session
        from lifecycle._torch.actions import TorchActions
        from lifecycle._torch.config import ParallelConfig

        actions = TorchActions(distributed or default_distributed(), parallel or ParallelConfig())
        made = Session(actions, **options)
        self.made.append(made)
        return made

    def close(self) -> None:
        """Take the failure edge on every session still live, newest first; raise the first error after all ran."""
        first: BaseException | None = None
        while self.made:
            made = self.made.pop()
            if made.state.is_final:
                continue
            try:
                made.fail(FixtureEnded(f"the test ended with the fixture's session in state {made.state.value}"))
            except BaseException as exc:  # noqa: BLE001 - tear the others down, then raise the first
                first = first or exc
        if first is not None:
            raise first


class MegatronParallelFactory:
    """``factory(tp=1, pp=1, cp=1, **parallel_fields)`` → ``megatron.core.parallel_state``, initialised.

    Runs a session (``SessionFactory``) to ``training``: the default group (the one that
    exists, or a new one on ``default_distributed()``), then Megatron-core's model-parallel
    state with tensor ``tp`` × pipeline ``pp`` × context ``cp``, its microbatch calculator
    and rerun state machine (``parallel_fields``: the other ``ParallelConfig`` fields).
    ``close`` always destroys what it initialised, whatever the test did.
    """

    def __init__(self, sessions: SessionFactory | None = None) -> None:
        """Make sessions with ``sessions`` (a new factory if None)."""
        self.sessions = sessions or SessionFactory()

    def __call__(self, tp: int = 1, pp: int = 1, cp: int = 1, **parallel_fields: Any) -> Any:
        """Initialise the state (see the class docstring) and return ``megatron.core.parallel_state``."""
        from megatron.core import parallel_state

        from lifecycle._torch.config import ParallelConfig

        parallel = ParallelConfig(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            **parallel_fields,
        )
        made = self.sessions(parallel=parallel, label=f"megatron_parallel(tp={tp}, pp={pp}, cp={cp})")
        try:
            made.init_distributed()
            made.init_globals()
            made.start_training()
        except BaseException as exc:
            if not made.state.is_final:
                made.fail(exc)
            raise
        return parallel_state

    def close(self) -> None:
        """Destroy every state it initialised (and any group its sessions created), whatever happened."""
        self.sessions.close()
