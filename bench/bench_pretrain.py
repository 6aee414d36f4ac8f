"""``pretrain`` against the same training loop written by hand, without the lifecycle.

World size 1, gloo, one process, the default tiny model (``lifecycle._training.model``), no
checkpoints, no evaluation, no progress log. After one short warm-up run of each side,
each round runs (a) the lifecycle, (b) the loop by hand and (b') the loop by hand once
more, back to back, the order rotating from round to round so that each takes every
position. The table reports, for wall-clock and for process CPU time, the median and
the fastest run of (a) and (b) and their ratio, and the median over rounds of (a)/(b)
(a burst of load from elsewhere hits a whole round); the last column gives the same
statistic for (b')/(b): the noise floor, how far from 1 a ratio lands when both sides do
exactly the same thing. CPU time is the steadier figure on a shared machine; wall-clock
would also show time spent waiting.
Both sides run with one torch thread: the benchmark machines are shared, and a
two-thread matmul with one core taken by someone else makes step times jump around.

(a) lifecycle: ``lifecycle.pretrain(config)`` with ``training.iterations = STEPS``,
    ``log_interval = 0``, ``eval_interval = 0``, no checkpoint directory, no callbacks.
    It runs a ``Session`` through every state: validate the config; a fresh
    ``TCPStore`` wrapped in a per-attempt ``PrefixStore``; ``init_process_group``;
    ``initialize_model_parallel`` (no gloo twins: the default on gloo), the microbatch
    calculator and rerun state machine; a SIGTERM handler; the model, Adam and the
    synthetic data; the loop; then the success plan (rerun state machine, microbatch
    calculator, ``destroy_model_parallel`` and the global memory buffer, barrier,
    ``destroy_process_group``, signal handler restored), with a journal entry per
    transition and a ``PretrainResult``.
(b) by hand: the same store (fresh, same timeout), ``init_process_group``,
    ``initialize_model_parallel`` with the same sizes, subgroup timeout and no gloo twins,
    the same microbatch calculator and rerun state machine; the same seed, the same
    ``default_model_provider`` model, ``torch.optim.Adam`` with the same learning rate,
    the same ``SyntheticTokens`` batches at the same indices and ``default_forward_step``;
    each step zeroes the gradients, runs forward and backward over the micro-batches,
    averages the gradients over megatron-core's data-parallel group when it has more
    than one rank (one flat all-reduce, as ``pretrain``; at world size 1 neither side
    runs it), steps the optimizer, and all-reduces the step's loss (one float64
    tensor; ``pretrain``'s also carries its two exit flags: the same one collective).
    Then the same releases by hand, the barrier and ``destroy_process_group``.

A second table does the same at tensor-parallel size 2 on 2 ranks (one process each,
``TP_STEPS`` steps, ``TP_REPEATS`` rounds): both sides build the default model with
megatron-core's tensor-parallel layers split over the two ranks, so each step runs the
layers' tensor-parallel all-reduces and the vocabulary-parallel loss on both. The hand
loop initializes the same Megatron-core state with ``tensor_model_parallel_size=2``,
creates its group on a store it keeps for all its runs (one ``PrefixStore`` per run, as
a hand-written retry would), and otherwise does what (b) does (data-parallel size 1:
no gradient all-reduce on either side). Rank 0's times are reported.

What only (a) does is the lifecycle's cost: the state machine, ledger, plans and
journal, config validation, the store prefix, the signal handler, the exit and fault
checks in each step, the probe batch ``pretrain`` reads to count tokens per step, the
result object. Both sides must produce bit-identical losses; the table says whether
they did (a check that they really did the same work).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, paired_ratio, raw_release, spawn, table

STEPS = 400
"""Optimizer steps per run: about 2 s a run on one CPU thread here (5 ms a step)."""
REPEATS = 9
"""Rounds: runs of each side."""
TIMEOUT_S = 60.0  # DistributedConfig's default, used by both sides
TP_STEPS = 200
"""Steps per run of the tensor-parallel table (2 ranks; each step also waits on the peer)."""
TP_REPEATS = 5
"""Rounds of the tensor-parallel table."""


def _config(steps: int, tp: int = 1) -> Any:
    from lifecycle import DistributedConfig, ParallelConfig, PretrainConfig, TrainingConfig

    # tp > 1: the world, rank and rendezvous come from the environment the rank was given.
    distributed = DistributedConfig(timeout_s=TIMEOUT_S)
    return PretrainConfig(
        distributed=DistributedConfig(world_size=1, rank=0, timeout_s=TIMEOUT_S) if tp == 1 else distributed,
        parallel=ParallelConfig(tensor_model_parallel_size=tp),
        training=TrainingConfig(iterations=steps, log_interval=0, eval_interval=0),
    )


def lifecycle_run(steps: int, tp: int = 1) -> tuple[float, float, list[float]]:
    """Wall-clock and CPU seconds for one ``pretrain`` call of ``steps`` steps, and its per-step losses."""
    from lifecycle import pretrain

    config = _config(steps, tp)
    start, cpu = time.perf_counter(), time.process_time()
    result = pretrain(config)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return elapsed, cpu, [loss for _, loss in result.losses]


def hand_run(steps: int, tp: int = 1, store: Any = None, prefix: str = "") -> tuple[float, float, list[float]]:
    """Wall-clock and CPU seconds for the same run written by hand, and its per-step losses.

    ``tp`` > 1: on the ranks of the environment, the group created on ``PrefixStore(prefix, store)``.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import (
        get_num_microbatches,
        init_num_microbatches_calculator,
    )
    from megatron.core.rerun_state_machine import (
        RerunMode,
        initialize_rerun_state_machine,
    )

    from lifecycle._training.model import SyntheticTokens, default_forward_step, default_model_provider

    config = _config(steps, tp)
    training, parallel = config.training, config.parallel
    start, cpu = time.perf_counter(), time.process_time()
    timeout = timedelta(seconds=TIMEOUT_S)
    if tp == 1:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timeout)
    else:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        group_store = dist.PrefixStore(prefix, store)
        dist.init_process_group("gloo", store=group_store, rank=rank, world_size=world_size, timeout=timeout)
    losses: list[float] = []
    try:
        parallel_state.initialize_model_parallel(
            parallel.tensor_model_parallel_size,
            parallel.pipeline_model_parallel_size,
            context_parallel_size=parallel.context_parallel_size,
            distributed_timeout_minutes=TIMEOUT_S / 60,
            create_gloo_process_groups=parallel.gloo_process_groups("gloo"),
        )
        world = dist.get_world_size()
        dp_size = parallel_state.get_data_parallel_world_size()
        dp_rank = parallel_state.get_data_parallel_rank()
        init_num_microbatches_calculator(
            dist.get_rank(), None, parallel.micro_batch_size * dp_size, parallel.micro_batch_size, dp_size
        )
        initialize_rerun_state_machine(mode=RerunMode.DISABLED)

        torch.manual_seed(training.seed)
        model = default_model_provider(config)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=training.lr)
        micro = get_num_microbatches()
        data = SyntheticTokens(config.model, parallel.micro_batch_size, training.seed)
        for step in range(1, training.iterations + 1):
            model.train()
            optimizer.zero_grad(set_to_none=False)
            total = 0.0
            for m in range(micro):
                index = ((step - 1) * micro + m) * dp_size + dp_rank
                loss = default_forward_step(data.batch("train", index), model)
                (loss / micro).backward()
                total += loss.item()
            if dp_size > 1:
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=parallel_state.get_data_parallel_group())
                offset = 0
                for p, g in zip(params, grads, strict=True):
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()
                    p.grad = g.div_(dp_size)
            optimizer.step()
            mean = torch.tensor([total / micro], dtype=torch.float64)
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
        dist.barrier()
    finally:
        raw_release()
        if tp == 1:
            del store
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return elapsed, cpu, losses


def _tp_rank(rank: int, world: int, port: int, queue: Any, hand_port: int) -> None:
    """One rank of the tensor-parallel table: the rounds of (a), (b), (b'); rank 0 puts the runs on ``queue``."""
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)},
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", hand_port, world, rank == 0, timedelta(seconds=TIMEOUT_S))
    count = iter(range(10**6))
    sides = {
        "life": lambda n: lifecycle_run(n, tp=2),
        "hand": lambda n: hand_run(n, 2, store, f"hand{next(count)}"),
        "again": lambda n: hand_run(n, 2, store, f"hand{next(count)}"),
    }
    runs: dict[str, list[tuple[float, float, list[float]]]] = {name: [] for name in sides}
    sides["life"](5), sides["hand"](5)  # warm up
    order = list(sides)
    for i in range(TP_REPEATS):
        for name in order[i % 3 :] + order[: i % 3]:
            runs[name].append(sides[name](TP_STEPS))
    queue.put(runs if rank == 0 else None)


def tp_table() -> str:
    """The tensor-parallel size 2 table: pretrain against the hand loop on 2 ranks."""
    from lifecycle.testing import free_port

    results = spawn(_tp_rank, 2, free_port(), timeout_s=1200)
    runs = next(r for r in results if r is not None)
    return _ratio_table(
        runs,
        f"pretrain vs the same loop by hand, tensor-parallel size 2 ({TP_STEPS} steps, 2 ranks, gloo, "
        f"1 torch thread each, {TP_REPEATS} runs of each, rotating; rank 0's s)",
    )


def _ratio_table(runs: dict[str, list[tuple[float, float, list[float]]]], title: str) -> str:
    """The Markdown table of ``runs`` (``life``, ``hand``, ``again``), and whether every run's losses agree."""
    same = all(a[2] == b[2] == c[2] for a, b, c in zip(runs["life"], runs["hand"], runs["again"], strict=True))
    rows = []
    for col, measure in ((0, "wall-clock"), (1, "CPU time")):
        life, hand, again = ([r[col] for r in runs[k]] for k in ("life", "hand", "again"))
        for name, stat in (("median", median), ("fastest run", min)):
            a, b, c = stat(life), stat(hand), stat(again)
            rows.append([f"{name}, {measure}", f"{a:.3f}", f"{b:.3f}", f"{a / b:.3f}", f"{c / b:.3f}"])
        rows.append(
            [
                f"median of back-to-back ratios, {measure}",
                "–",
                "–",
                f"{paired_ratio(life, hand):.3f}",
                f"{paired_ratio(again, hand):.3f}",
            ]
        )
    header = [
        "statistic",
        "lifecycle.pretrain",
        "by hand",
        "lifecycle ÷ by hand (target ≤ 1.01)",
        "by hand again ÷ by hand (noise floor)",
    ]
    return table(title, header, rows) + f"\nSame losses on every run, bit for bit: {'yes' if same else 'NO'}.\n"


def main() -> str:
    """Rotate lifecycle, by hand, by hand again (world size 1, then tensor-parallel size 2); the tables."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs: dict[str, list[tuple[float, float, list[float]]]] = {"life": [], "hand": [], "again": []}
    sides = {"life": lifecycle_run, "hand": hand_run, "again": hand_run}
    order = list(sides)
    try:
        lifecycle_run(5), hand_run(5)  # warm up imports, allocator, first-time setup
        for i in range(REPEATS):
            for name in order[i % 3 :] + order[: i % 3]:  # each side takes each position in turn
                runs[name].append(sides[name](STEPS))
    finally:
        torch.set_num_threads(threads)
    title = (
        f"pretrain vs the same loop by hand ({STEPS} steps, world size 1, gloo, 1 torch thread, "
        f"{REPEATS} runs of each, rotating; s)"
    )
    return (
        _ratio_table(runs, title) + "\n"
        "What this shows: what the lifecycle costs over a whole training run, setup and "
        "teardown included, against the loop you would write without it (same model, data, "
        "optimizer, collectives and Megatron-core state); identical losses show every run did "
        "the same computation. The last column times the hand-written loop against itself in "
        "the same rotation: on a shared machine a ratio is only resolved to within that "
        "distance of 1, so a lifecycle ratio no further from 1 than the noise floor is no "
        "measurable cost. The fastest run of each side is the best estimate of what the work "
        "costs when nothing else interferes.\n\n" + tp_table()
    )


if __name__ == "__main__":
    print(main())
