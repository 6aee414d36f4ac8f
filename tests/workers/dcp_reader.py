"""Read a lifecycle checkpoint with torch's own tools only: this script never imports lifecycle.

Usage: ``dcp_reader.py MODE FOLDER [OUT]``, FOLDER a committed step folder:

- ``plain``: world 1, ``dcp.load(no_dist=True)`` into the state of seed 0 (a one-slice checkpoint);
- ``slices``: world 1, ``dcp.load(no_dist=True)`` of every tensor-parallel slice (``tp<r>_pp0``, seed r);
- ``ranks``: under ``launch_ranks`` (gloo), each rank ``dcp.load``s its own slice ``tp<tp>_pp0``, tp = RANK % 2;
- ``convert``: ``format_utils.dcp_to_torch_save(FOLDER, OUT)``, then ``torch.load(weights_only=True)``.

``expected_state(seed)`` is what the writers saved (``tests/workers/checkpoint_worker.py``
and ``tests/checkpoint/test_dcp_format.py`` import it). Prints one JSON line: whether
every tensor is byte-equal (same dtype, shape and bytes) to the expected one, the keys
read, and whether lifecycle was imported.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import torch


def expected_state(seed: int) -> dict[str, Any]:
    """A model's and its optimizer's state after one step (seeded), and a step count: what the writers saved."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 4}


def _tensors_only(value: Any) -> Any:
    """``value`` with only its tensors (zeroed copies) and the dicts that lead to them: a ``dcp.load`` target."""
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        kept = {k: _tensors_only(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {}}
    return None


def _byte_equal(got: Any, want: Any, where: str, bad: list[str]) -> None:
    """Append to ``bad`` every tensor of ``want`` that ``got`` lacks or holds with other dtype, shape or bytes."""
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
        if not (ok and got.reshape(-1).view(torch.uint8).equal(want.reshape(-1).view(torch.uint8))):
            bad.append(where)
    elif isinstance(want, dict):
        for k, v in want.items():
            # dcp_to_torch_save gives dict keys back as strings
            sub = got.get(k, got.get(str(k))) if isinstance(got, dict) else None
            _byte_equal(sub, v, f"{where}.{k}", bad)


def _keys(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        return [key for k, v in value.items() for key in _keys(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def _drop_non_tensors(value: Any) -> Any:
    """``value`` with only its tensors (as they are) and the dicts that lead to them."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        kept = {k: _drop_non_tensors(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {}}
    return None


def _saved(mode: str, slices: list[str]) -> Any:
    """What the writers saved that ``mode`` reads back: seed 0's state, or one per tensor-parallel slice."""
    if mode == "plain" or (mode == "convert" and not slices):
        return expected_state(0)
    return {key: expected_state(int(key[2])) for key in slices}


def main(mode: str, folder: str, out: str | None = None) -> None:
    """Run ``mode`` on ``folder``; print the JSON report."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if mode == "convert":
        assert out is not None
        dcp_to_torch_save(folder, out)
        target = torch.load(out, weights_only=True)
        want = _saved(mode, [k for k in target if str(k).startswith("tp")])
    elif mode in ("plain", "slices"):
        want = _saved(mode, ["tp0_pp0", "tp1_pp0"])
        target = _tensors_only(want)
        dcp.load(target, checkpoint_id=folder, no_dist=True)
    elif mode == "ranks":
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=30))
        want = _saved(mode, [f"tp{int(os.environ['RANK']) % 2}_pp0"])
        target = _tensors_only(want)
        dcp.load(target, checkpoint_id=folder)  # collective, over the default group
        dist.barrier()
        dist.destroy_process_group()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    bad: list[str] = []
    _byte_equal(target, _drop_non_tensors(want), "", bad)
    imported = any(name == "lifecycle" or name.startswith("lifecycle.") for name in sys.modules)
    print(json.dumps({"bad": bad, "keys": sorted(_keys(target)), "lifecycle_imported": imported}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
