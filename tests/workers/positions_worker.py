"""One rank of ``tests/distributed/test_positions_gloo.py``: the collective wrappers on a real two-rank gloo group.

Prints one JSON line: what the page said after each kind of call, whether the wrappers
were put back, and whether a group the wrappers saw was freed once destroyed.
"""

from __future__ import annotations

import gc
import json
import os
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from lifecycle._liveness import page
from lifecycle._liveness.collectives import Positions
from lifecycle._liveness.rank import Marks


def seen(marks: Marks) -> list[list[object]]:
    """The page's positions: [key, entered, left, op, blind] per group."""
    return [[c.key, c.entered, c.left, c.op, c.blind] for c in page.read_collectives(marks._page)]


def main() -> None:
    """Run the calls in order on both ranks; print what the page said after each."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    originals = (
        dist.all_reduce,
        dist.distributed_c10d.all_gather,
        dist.distributed_c10d.Work.wait,
        dist._coalescing_manager,
    )
    marks = Marks()
    positions = Positions(marks)
    positions.install()
    report: dict[str, object] = {"rank": rank}
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    report["sync"] = seen(marks)
    report["site"] = page.read_collectives(marks._page)[0].site
    work = dist.all_reduce(tensor, async_op=True)
    report["issued"] = seen(marks)
    assert work is not None
    work.wait()
    report["waited"] = seen(marks)
    dist.all_gather_object([None, None], rank)
    report["object"] = seen(marks)
    with dist.distributed_c10d._coalescing_manager():  # as Megatron-core's DDP reduces a bucket group's gradients
        dist.all_reduce(tensor)
        dist.all_reduce(torch.ones(2))
    report["coalesced"] = seen(marks)
    report["coalesced_site"] = page.read_collectives(marks._page)[0].site
    with dist._coalescing_manager(async_ops=True) as manager:
        dist.all_reduce(tensor, async_op=True)
    report["coalesced_issued"] = seen(marks)
    manager.wait()
    report["coalesced_waited"] = seen(marks)
    group = dist.new_group([0, 1])
    dist.barrier(group=group)
    report["second_group"] = seen(marks)
    dist.distributed_c10d._get_default_group().allreduce([tensor]).wait()  # past the wrappers
    marks.mark("step", 1)  # the cross-check at a mark
    report["bypassed"] = seen(marks)
    ref = weakref.ref(group)
    dist.destroy_process_group(group)
    del group
    gc.collect()
    report["group_freed"] = ref() is None
    bound = dist.all_reduce  # as a module that imported it while installed keeps it
    positions.uninstall()
    before = seen(marks)
    bound(tensor)
    report["bound_after_uninstall"] = seen(marks) == before
    report["restored"] = originals == (
        dist.all_reduce,
        dist.distributed_c10d.all_gather,
        dist.distributed_c10d.Work.wait,
        dist._coalescing_manager,
    )
    marks.close()
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
