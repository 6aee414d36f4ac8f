"""Checkpoints that follow a ShardLayout: the manifest records it, a resume checks it, replicas share one shard.

One process (a world of one); the multi-rank side (two tensor-parallel shards, a
data-parallel replica that writes nothing, a resume on another data-parallel size) is
in ``tests/training/test_tensor_parallel.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lifecycle.checkpoint import AsyncCheckpointer, CheckpointMismatch, load_checkpoint
from lifecycle.checkpoint.layout import ShardLayout, describe_layout, step_dir


def saved(directory: Path, layout: ShardLayout | None, value: float = 1.0) -> dict[str, Any]:
    """Save ``{"w": [value] * 3}`` as step 1 with ``layout`` (no group: a world of one); return its manifest."""
    writer = AsyncCheckpointer(directory, layout=layout)
    writer.save(1, {"w": torch.full((3,), value)})
    assert writer.finalize() == 1
    manifest: dict[str, Any] = json.loads((step_dir(directory, 1) / "manifest.json").read_text())
    return manifest


def test_the_manifest_records_the_layout_and_lists_shards_by_slice(tmp_path: Path) -> None:
    """With a layout the manifest holds its sizes and each shard's slice index; without one, neither (as before)."""
    manifest = saved(tmp_path / "with", ShardLayout())
    assert manifest["layout"] == {"tensor": 1, "pipeline": 1, "data": 1}
    assert [(s["shard"], s["rank"]) for s in manifest["shards"]] == [(0, 0)]
    plain = saved(tmp_path / "without", None)
    assert "layout" not in plain and "shard" not in plain["shards"][0]


def test_another_data_parallel_size_loads_the_slice_shard(tmp_path: Path) -> None:
    """A checkpoint whose layout says 2 data-parallel replicas loads on 1: same tensor and pipeline sizes suffice."""
    manifest = saved(tmp_path, ShardLayout(), 7.0)
    manifest["layout"]["data"], manifest["world_size"] = 2, 2  # as the first of 2 replicas wrote it
    (step_dir(tmp_path, 1) / "manifest.json").write_text(json.dumps(manifest))
    target = {"w": torch.zeros(3)}
    assert load_checkpoint(tmp_path, target, layout=ShardLayout()) == 1
    assert target["w"].tolist() == [7.0, 7.0, 7.0]


@pytest.mark.parametrize(
    ("saved_with", "loaded_with", "found", "wanted"),
    [
        ({"tensor": 2, "pipeline": 1, "data": 1}, ShardLayout(), "TP2 PP1 DP1", "TP1 PP1 DP1"),
        ({"tensor": 1, "pipeline": 2, "data": 1}, ShardLayout(), "TP1 PP2 DP1", "TP1 PP1 DP1"),
        ({"tensor": 1, "pipeline": 1, "data": 1}, None, "TP1 PP1 DP1", "one shard per rank"),
        (None, ShardLayout(), "one shard per rank (world size 1)", "TP1 PP1 DP1"),
    ],
)
def test_another_tensor_or_pipeline_size_is_refused_naming_both_layouts(
    tmp_path: Path, saved_with: dict[str, int] | None, loaded_with: ShardLayout | None, found: str, wanted: str
) -> None:
    """Other tensor or pipeline sizes (or a layout against none): CheckpointMismatch naming both; nothing loaded.

    Before layouts, a checkpoint of another tensor-parallel size loaded each rank's
    file by rank number whenever the world size matched.
    """
    manifest = saved(tmp_path, ShardLayout() if saved_with is not None else None)
    if saved_with is not None and saved_with != manifest["layout"]:
        # Another layout's shards: as many as it has slices, each a copy of the one written.
        entry = manifest["shards"][0]
        count = saved_with["tensor"] * saved_with["pipeline"]
        manifest["layout"] = saved_with
        manifest["shards"] = [{**entry, "shard": i, "rank": i} for i in range(count)]
        (step_dir(tmp_path, 1) / "manifest.json").write_text(json.dumps(manifest))
    target = {"w": torch.zeros(3)}
    with pytest.raises(CheckpointMismatch) as caught:
        load_checkpoint(tmp_path, target, layout=loaded_with)
    assert caught.value.what.startswith("layout")
    assert (caught.value.found, caught.value.wanted) == (found, wanted)
    assert f"{found} in the checkpoint, {wanted} in this run" in str(caught.value)
    assert target["w"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "fields",
    [{"tensor": 0}, {"tensor": 2, "tensor_rank": 2}, {"data_rank": -1}, {"pipeline": True}],
)
def test_a_layout_out_of_its_own_range_is_refused(fields: dict[str, Any]) -> None:
    """Sizes below 1, booleans, and coordinates outside their size raise ValueError naming the field."""
    with pytest.raises(ValueError, match="ShardLayout"):
        ShardLayout(**fields)


def test_a_layout_that_does_not_fit_the_group_is_refused(tmp_path: Path) -> None:
    """A writer whose layout needs 2 ranks in a world of one raises ValueError naming the layout, before any file."""
    with pytest.raises(ValueError, match="TP2 PP1 DP1 needs 2 ranks"):
        AsyncCheckpointer(tmp_path / "ckpt", layout=ShardLayout(tensor=2))
    assert not (tmp_path / "ckpt").exists()
    assert describe_layout({"tensor": 2, "pipeline": 1, "data": 2}) == "TP2 PP1 DP2"


def test_data_parallel_replicas_of_a_shard_name_one_replica_set_and_no_replication_names_none() -> None:
    """``replica``: the tensor x pipeline sizes and the shard, the same for every data-parallel rank of it; "" when
    the data-parallel size is 1 (no rank holds this state but this one)."""
    ranks = [ShardLayout(tensor=2, pipeline=1, data=2, tensor_rank=t, data_rank=d) for d in (0, 1) for t in (0, 1)]
    assert [layout.replica for layout in ranks] == ["2x1:0", "2x1:1", "2x1:0", "2x1:1"]
    assert ShardLayout(tensor=2, tensor_rank=1).replica == ""
