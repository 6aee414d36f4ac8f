"""Configuration of the distributed resources, validated before anything is acquired.

No torch import here: a bad value is reported (as ``ConfigError`` naming the field)
without loading torch, and long before a store, a group or a Megatron global exists.

``None`` in ``DistributedConfig`` means "read it from the environment, as torchrun sets
it" (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from types import MappingProxyType

from lifecycle._core.errors import ConfigError, check_number

BACKENDS: tuple[str, ...] = ("gloo", "nccl")
"""The process-group backends the library supports."""

RERUN_MODES: tuple[str, ...] = ("disabled", "validate_results", "report_determinism_stats")
"""The values of megatron-core's ``RerunMode`` (kept here so this module needs no Megatron import)."""

LOOPBACK = "127.0.0.1"
"""The store address used for a world of one when none is configured."""


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where and as whom this process joins the default group: every value resolved.

    ``use_agent_store`` is True under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``):
    torchrun's agent already serves the store at ``master_addr:master_port``, so every
    rank connects as a client and none hosts it. ``master_port`` 0 (only for a world of
    one) lets the operating system pick a free port.
    """

    world_size: int
    rank: int
    master_addr: str
    master_port: int
    local_rank: int | None
    use_agent_store: bool


def _env_int(env: Mapping[str, str], field: str, name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(field, f"{name}={raw!r} in the environment is not an integer") from None


@dataclass(frozen=True, slots=True)
class DistributedConfig:
    """How to create the default process group.

    ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (GPU). ``world_size``, ``rank``,
    ``local_rank``, ``master_addr``, ``master_port``: None reads ``WORLD_SIZE``, ``RANK``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``. ``local_rank`` selects the CUDA
    device for nccl when the process sees several (``cuda_device_index``). ``timeout_s``:
    the store's and every group's timeout, in seconds (with nccl, the watchdog's); keep
    it short so a lost peer surfaces as an error instead of a long hang.

    Construction raises ``ConfigError`` naming the field for a value that is wrong on
    its own; ``resolve`` checks what needs the environment.
    """

    backend: str = "gloo"
    world_size: int | None = None
    rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    timeout_s: float = 60.0
    local_rank: int | None = None

    def __post_init__(self) -> None:
        """Reject values that are wrong whatever the environment says."""
        if self.backend not in BACKENDS:
            raise ConfigError("distributed.backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        check_number("distributed.world_size", self.world_size, at_least=1, optional=True)
        check_number("distributed.rank", self.rank, at_least=0, optional=True)
        check_number("distributed.local_rank", self.local_rank, at_least=0, optional=True)
        if self.world_size is not None and self.rank is not None and self.rank >= self.world_size:
            raise ConfigError("distributed.rank", f"must be below world_size {self.world_size}, got {self.rank}")
        check_number("distributed.master_port", self.master_port, at_least=0, at_most=65535, optional=True)
        if self.master_addr is not None and not self.master_addr:
            raise ConfigError("distributed.master_addr", "must not be empty")
        check_number("distributed.timeout_s", self.timeout_s, integer=False, above=0, unit="seconds")

    def resolve_world(self, env: Mapping[str, str] | None = None) -> tuple[int | None, int | None]:
        """Return ``(world_size, rank)``, each from the config or else the environment, or None if neither.

        Raises ``ConfigError`` if a value read from the environment is invalid.
        """
        env = os.environ if env is None else env
        world = (
            self.world_size if self.world_size is not None else _env_int(env, "distributed.world_size", "WORLD_SIZE")
        )
        rank = self.rank if self.rank is not None else _env_int(env, "distributed.rank", "RANK")
        check_number("distributed.world_size", world, at_least=1, optional=True)
        check_number("distributed.rank", rank, at_least=0, optional=True)
        if world is not None and rank is not None and rank >= world:
            raise ConfigError("distributed.rank", f"must be below world_size {world}, got {rank}")
        return world, rank

    def resolve(self, env: Mapping[str, str] | None = None) -> Rendezvous:
        """Resolve every value needed to create the default group; raise ``ConfigError`` naming a missing or bad one.

        A world of one needs no address: it defaults to ``127.0.0.1`` and port 0 (any
        free port). nccl needs ``local_rank``, unless ``CUDA_VISIBLE_DEVICES`` names exactly
        one device (see ``cuda_device_index``).
        """
        env = os.environ if env is None else env
        world, rank = self.resolve_world(env)
        if world is None:
            raise ConfigError("distributed.world_size", "not given, and WORLD_SIZE is not set in the environment")
        if rank is None:
            raise ConfigError("distributed.rank", "not given, and RANK is not set in the environment")
        addr = self.master_addr if self.master_addr is not None else env.get("MASTER_ADDR") or None
        port = (
            self.master_port
            if self.master_port is not None
            else _env_int(env, "distributed.master_port", "MASTER_PORT")
        )
        if addr is None:
            if world != 1:
                raise ConfigError("distributed.master_addr", "not given, and MASTER_ADDR is not set in the environment")
            addr = LOOPBACK
        if port is None:
            if world != 1:
                raise ConfigError("distributed.master_port", "not given, and MASTER_PORT is not set in the environment")
            port = 0
        check_number("distributed.master_port", port, at_least=0, at_most=65535)
        if port == 0 and world != 1:
            raise ConfigError("distributed.master_port", "0 (any free port) only works for a world of one")
        local_rank = (
            self.local_rank if self.local_rank is not None else _env_int(env, "distributed.local_rank", "LOCAL_RANK")
        )
        check_number("distributed.local_rank", local_rank, at_least=0, optional=True)
        if self.backend == "nccl" and local_rank is None and len(visible_devices(env) or ()) != 1:
            raise ConfigError(
                "distributed.local_rank",
                "nccl needs it to pick the CUDA device, and LOCAL_RANK is not set (or make one GPU visible "
                "to each process with CUDA_VISIBLE_DEVICES)",
            )
        use_agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        return Rendezvous(world, rank, addr, port, local_rank, use_agent_store)


_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """How to lay out Megatron-core's model-parallel state on the world.

    ``global_batch_size`` None means ``micro_batch_size * data_parallel_size``.
    ``rerun_mode`` is a megatron-core ``RerunMode`` value.

    ``seed`` seeds megatron-core's tensor-parallel RNG tracker
    (``model_parallel_cuda_manual_seed``) right after the model-parallel state is created,
    when CUDA is available (its states are CUDA generator states; without CUDA the
    tracker is left unseeded, as megatron-core's CPU layers never fork it).

    ``create_gloo_process_groups`` is passed to ``initialize_model_parallel``: True builds
    a gloo twin of the (expert) data-parallel groups, which megatron-core's distributed
    optimizer asks for (its default ``use_gloo_process_groups=True``); False builds none.
    None, the default, means "only when the default group's backend is not gloo",
    resolved by ``gloo_process_groups`` against the default group that exists when the
    Megatron state is created: on a gloo world the twins only duplicate groups that are
    gloo already, and each is one more group to create and to free (megatron-core
    destroys them one by one, each waiting on gloo's socket loop: see
    docs/benchmarks.md, gloo-twin-destroy). On a gloo world, pass
    ``use_gloo_process_groups=False`` to megatron-core's optimizer, or set True here.

    Construction raises ``ConfigError`` naming the field for a value that is wrong on
    its own; ``check_world`` checks the values that depend on the world size.
    """

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    rerun_mode: str = "disabled"
    create_gloo_process_groups: bool | None = None
    seed: int = 1234

    def __post_init__(self) -> None:
        """Reject values that are wrong whatever the world size."""
        for name in (*_SIZES, "micro_batch_size"):
            check_number(f"parallel.{name}", getattr(self, name), at_least=1)
        check_number("parallel.global_batch_size", self.global_batch_size, at_least=1, optional=True)
        check_number("parallel.seed", self.seed, at_least=0)
        if self.rerun_mode not in RERUN_MODES:
            raise ConfigError(
                "parallel.rerun_mode", f"must be one of {', '.join(RERUN_MODES)}, got {self.rerun_mode!r}"
            )
        if not (self.create_gloo_process_groups is None or isinstance(self.create_gloo_process_groups, bool)):
            raise ConfigError(
                "parallel.create_gloo_process_groups",
                f"must be True, False or None, got {self.create_gloo_process_groups!r}",
            )

    def gloo_process_groups(self, backend: str) -> bool:
        """Whether ``initialize_model_parallel`` builds gloo twins on a default group of ``backend``.

        ``create_gloo_process_groups`` if it is set, else True exactly when ``backend``
        is not ``"gloo"``.
        """
        if self.create_gloo_process_groups is None:
            return backend != "gloo"
        return self.create_gloo_process_groups

    @property
    def model_parallel_size(self) -> int:
        """tensor × pipeline × context parallel size: the ranks one model replica spans."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

    def check_world(self, world_size: int) -> None:
        """Raise ``ConfigError`` naming the field unless this layout fits a world of ``world_size`` ranks.

        The parallel sizes' product must divide the world size (the field named is the
        first size whose running product stops dividing it), and the global batch must
        be a multiple of ``micro_batch_size * data_parallel_size``.
        """
        product = 1
        for name in _SIZES:
            product *= getattr(self, name)
            if world_size % product:
                raise ConfigError(
                    f"parallel.{name}",
                    f"{' * '.join(_SIZES)} = {self.model_parallel_size} does not divide world_size {world_size}",
                )
        per_step = self.micro_batch_size * (world_size // self.model_parallel_size)
        if self.global_batch_size is not None and self.global_batch_size % per_step:
            raise ConfigError(
                "parallel.global_batch_size",
                f"{self.global_batch_size} is not a multiple of micro_batch_size * data_parallel_size = {per_step}",
            )

    def data_parallel_size(self, world_size: int) -> int:
        """The data-parallel size on a world of ``world_size`` ranks (after ``check_world``)."""
        self.check_world(world_size)
        return world_size // self.model_parallel_size

    def resolved_global_batch_size(self, world_size: int) -> int:
        """The global batch size on a world of ``world_size`` ranks: as given, or micro × data-parallel size."""
        if self.global_batch_size is not None:
            self.check_world(world_size)
            return self.global_batch_size
        return self.micro_batch_size * self.data_parallel_size(world_size)


# -- nccl: the device each rank binds, and the environment a rank-local abort needs --------


def visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` in ``env`` (indices or UUIDs), or None if it is not set.

    Empty entries are dropped (``""`` makes no device visible). Only counts matter here:
    CUDA itself decides what an entry means, and ``torch.cuda.device_count()`` is the truth.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return tuple(entry.strip() for entry in raw.split(",") if entry.strip())


def cuda_device_index(local_rank: int | None, device_count: int, env: Mapping[str, str] | None = None) -> int:
    """The CUDA device index this rank binds for nccl; ``ConfigError`` naming the field if there is none to bind.

    One rule, decided before any CUDA call: with exactly one visible device, every rank
    binds device 0 (one GPU per process, ``CUDA_VISIBLE_DEVICES`` set per rank, whatever
    ``LOCAL_RANK`` says); with several, ``local_rank`` picks one and must be below
    ``device_count``. Refused: no device (``backend``); several devices and no
    ``local_rank``; ``local_rank`` past the devices; and ``local_rank`` >= 1 with one
    device and ``CUDA_VISIBLE_DEVICES`` unset (``local_rank``): that is the node's only
    GPU, which a lower local rank binds too, and NCCL refuses two ranks on one device.
    ``env`` (default ``os.environ``) is only read.
    """
    env = os.environ if env is None else env
    visible = visible_devices(env)
    shown = "unset" if visible is None else repr(env.get("CUDA_VISIBLE_DEVICES"))
    if device_count < 1:
        raise ConfigError(
            "distributed.backend", f"nccl needs a CUDA device, and none is visible (CUDA_VISIBLE_DEVICES {shown})"
        )
    if device_count == 1:
        if local_rank not in (None, 0) and visible is None:
            raise ConfigError(
                "distributed.local_rank",
                f"{local_rank}, but this process sees one CUDA device and CUDA_VISIBLE_DEVICES is unset: local "
                "rank 0 binds that device too, and NCCL refuses two ranks on one device; run one rank per GPU, "
                "or give each rank its own GPU with CUDA_VISIBLE_DEVICES",
            )
        return 0
    if local_rank is None:
        raise ConfigError(
            "distributed.local_rank",
            f"this process sees {device_count} CUDA devices (CUDA_VISIBLE_DEVICES {shown}) and LOCAL_RANK is not "
            "set to pick one",
        )
    if local_rank >= device_count:
        raise ConfigError(
            "distributed.local_rank",
            f"{local_rank} is not below the CUDA device count {device_count} (CUDA_VISIBLE_DEVICES {shown})",
        )
    return local_rank


NCCL_ENV_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "TORCH_DIST_USE_NCCL2": "0"}
)
"""What a session on nccl sets when the variable is unset (read by torch at each group's creation).

Meanings from torch 2.13's ``ProcessGroupNCCL.hpp``. ``TORCH_NCCL_ASYNC_ERROR_HANDLING``
(legacy name ``NCCL_ASYNC_ERROR_HANDLING``), what the watchdog does when a collective
times out or NCCL reports an error: 0 NoHandling (nothing: the communicators are not
aborted, a rank blocked with a failed peer is never released), 1 TearDown (abort the
communicators, then kill the process), 2 CleanUpOnly (abort the communicators, leave
the process alive: its next collective raises and its failure path runs), 3
SkipCleanUp (kill the process without aborting; torch's default, and torchrun sets 1
when unset). Only 2 keeps a rank alive to run its own teardown or an in-process
restart. ``TORCH_NCCL_RETHROW_CUDA_ERRORS`` (default true): the watchdog rethrows a
CUDA error, which terminates the process; false lets the error reach the main thread.

``TORCH_DIST_USE_NCCL2`` (torch 2.15+; older releases never read it): backend ``"nccl"``
builds the new ``ProcessGroupNCCL2`` (not a subclass of ``ProcessGroupNCCL``) unless it is
exactly ``"0"``, read once, when the process creates its first nccl group. The error
handling above was read from ``ProcessGroupNCCL``; ``ProcessGroupNCCL2``'s behaviour on a
timeout and on an abort with work in flight has not been shown by a GPU check yet, so a
session on nccl selects the legacy backend: 0 when unset, any other value refused
(``check_nccl_backend`` refuses a process whose "nccl" is already the new one).
"""

NCCL2_VARIABLE = "TORCH_DIST_USE_NCCL2"
_NCCL2_CREATOR = "_create_nccl2_process_group"  # torch 2.15's distributed_c10d

_ASYNC_MODES = {
    0: "NoHandling: the watchdog neither aborts the communicators nor raises, so a rank blocked in a collective "
    "with a failed peer is never released",
    1: "TearDown: the watchdog kills the process at a collective timeout or NCCL error, so a peer's failure takes "
    "this rank down instead of releasing it to its failure path",
    3: "SkipCleanUp (torch's default): the watchdog kills the process at a collective timeout or NCCL error, "
    "without even aborting the communicators",
}
_TRUE = ("y", "yes", "1", "t", "true")  # torch's getCvarBool spellings
_FALSE = ("n", "no", "0", "f", "false")


def check_nccl_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Check the NCCL variables a rank-local abort depends on; return those to set (``NCCL_ENV_DEFAULTS`` unset).

    Raises ``ConfigError`` naming the variable, its value, why it breaks a rank-local
    abort and what to set, for ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (or the legacy
    ``NCCL_ASYNC_ERROR_HANDLING`` it overrides) other than 2, and for
    ``TORCH_NCCL_RETHROW_CUDA_ERRORS`` true or not a boolean. ``env`` (default
    ``os.environ``) is only read; ``set_nccl_environment`` applies the result.
    """
    env = os.environ if env is None else env
    missing: dict[str, str] = {}
    name = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    found = name if name in env else "NCCL_ASYNC_ERROR_HANDLING" if "NCCL_ASYNC_ERROR_HANDLING" in env else None
    if found is None:
        missing[name] = NCCL_ENV_DEFAULTS[name]
    else:
        raw = env[found]
        try:
            mode: int | None = int(raw.strip())
        except ValueError:
            mode = None
        if mode != 2:
            why = _ASYNC_MODES.get(mode, "not a mode torch knows (0-3)") if mode is not None else "not an integer"
            torchrun = " (torchrun sets 1 when it is unset: export it before starting torchrun)" if mode == 1 else ""
            raise ConfigError(
                found,
                f"{found}={raw!r} is {why}; nccl sessions need 2 (CleanUpOnly: abort the communicators, keep the "
                f"process), so set {name}=2{torchrun}, or unset it and the session sets 2",
            )
    name = "TORCH_NCCL_RETHROW_CUDA_ERRORS"
    if name not in env:
        missing[name] = NCCL_ENV_DEFAULTS[name]
    elif (raw := env[name]).strip().lower() not in _FALSE:
        if raw.strip().lower() in _TRUE:
            why = "true: the watchdog rethrows a CUDA error, which terminates the process"
        else:
            why = "not a boolean torch reads (0/1, true/false, yes/no)"
        raise ConfigError(name, f"{name}={raw!r} is {why}; set {name}=0, or unset it and the session sets 0")
    name = NCCL2_VARIABLE
    if name not in env:
        missing[name] = NCCL_ENV_DEFAULTS[name]
    elif (raw := env[name]) != "0":  # torch compares with "0" exactly: anything else is the new backend
        raise ConfigError(
            name,
            f"{name}={raw!r} selects torch 2.15's ProcessGroupNCCL2 for backend 'nccl', whose abort and timeout "
            "behaviour under TORCH_NCCL_ASYNC_ERROR_HANDLING=2 no GPU check has shown yet; set "
            f"{name}=0 (the legacy ProcessGroupNCCL), or unset it and the session sets 0",
        )
    return missing


def check_nccl_backend() -> None:
    """Refuse a process whose backend ``"nccl"`` is already torch 2.15's ``ProcessGroupNCCL2``, saying how to avoid it.

    torch binds the name at the process's first nccl group (``TORCH_DIST_USE_NCCL2``,
    see ``NCCL_ENV_DEFAULTS``): once bound to the new backend, setting the variable later
    changes nothing, so every group a session would create (Megatron's too) would be a
    ``ProcessGroupNCCL2``. ``ConfigError`` (field ``TORCH_DIST_USE_NCCL2``) then; nothing
    on torch before 2.15 or before any nccl group exists. Only reads torch's registry.
    """
    c10d = sys.modules.get("torch.distributed")  # not imported: no nccl group exists (no torch import here)
    plugins = getattr(getattr(c10d, "Backend", None), "_plugins", None) or {}
    plugin = plugins.get("NCCL")
    if getattr(getattr(plugin, "creator_fn", None), "__name__", None) == _NCCL2_CREATOR:
        raise ConfigError(
            NCCL2_VARIABLE,
            "this process's backend 'nccl' is already torch 2.15's ProcessGroupNCCL2 (its first nccl group was "
            f"created without {NCCL2_VARIABLE}=0), whose abort and timeout behaviour no GPU check has shown yet; "
            f"export {NCCL2_VARIABLE}=0 before the process creates any nccl group (before torchrun starts it)",
        )


def set_nccl_environment(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Check as ``check_nccl_environment``, then set the missing defaults in ``env`` (default ``os.environ``).

    Returns what it set. They stay set after the session: torch reads them when each
    nccl group (Megatron's subgroups too) is created, and a later session needs the same.
    """
    target: MutableMapping[str, str] = os.environ if env is None else env
    missing = check_nccl_environment(target)
    target.update(missing)
    return missing


def validate(
    distributed: DistributedConfig, parallel: ParallelConfig, env: Mapping[str, str] | None = None
) -> Rendezvous:
    """Check both configs against each other and the environment, and return the resolved rendezvous.

    Raises ``ConfigError`` naming the field for the first bad or missing value (for
    nccl, also naming an NCCL variable that would keep a rank from aborting on its own,
    or select torch 2.15's unverified ``ProcessGroupNCCL2``: ``check_nccl_environment``,
    ``check_nccl_backend``). Call it before acquiring anything; it only reads
    ``env`` (default ``os.environ``).
    """
    rendezvous = distributed.resolve(env)
    parallel.check_world(rendezvous.world_size)
    if distributed.backend == "nccl":
        check_nccl_environment(os.environ if env is None else env)
        check_nccl_backend()
    return rendezvous
