"""docs/multinode.md shows what the two-node tests run: the same retry loop, the same torchrun flags."""

from __future__ import annotations

import re
from pathlib import Path

from multinode.cluster import REPO, WORKER, torchrun_command
from multinode.netns import Node

DOC = REPO / "docs" / "multinode.md"
RDZV_FLAGS = ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--max-restarts")


def blocks(language: str) -> list[str]:
    """The fenced ``language`` code blocks of docs/multinode.md, in order."""
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def function(source: str, name: str) -> str:
    """The text of top-level function ``name`` in ``source``: its ``def`` line to the next unindented line."""
    match = re.search(rf"^def {name}\(.*?(?=^\S)", source + "\n#", flags=re.S | re.M)
    assert match, f"no function {name} found"
    return match.group(0).rstrip()


def flags(command: str) -> dict[str, str]:
    """``--name=value`` (or bare ``--name``) options of a shell command line, continuation lines joined."""
    return dict(re.findall(r"(--[\w-]+)(?:=(\S+))?", command.replace("\\\n", " ")))


def test_docs_retry_loop_is_the_one_the_two_node_test_runs() -> None:
    """The documented ``train`` loop is character for character the worker's (an edit to either breaks this)."""
    documented = [function(block, "train") for block in blocks("python") if "def train(" in block]
    assert len(documented) == 1
    assert documented[0] == function(Path(WORKER).read_text(encoding="utf-8"), "train")


def test_docs_launch_lines_use_the_flags_the_two_node_test_passes() -> None:
    """Each documented torchrun/srun line passes the rendezvous flags the test's torchrun command passes."""
    node = Node(index=0, netns="ns", ifname="veth", addr="10.231.0.1")
    tested = flags(" ".join(torchrun_command(node, node, 1, "run")))
    assert set(RDZV_FLAGS) <= set(tested)
    launches = [block for block in blocks("bash") if "torchrun" in block or "torch.distributed.run" in block]
    assert len(launches) == 3  # plain torchrun, Slurm, and the test's own line
    for launch in launches:
        shown = flags(launch)
        missing = [name for name in RDZV_FLAGS if name not in shown]
        assert not missing, f"{missing} missing from:\n{launch}"
        assert shown["--rdzv-backend"] == tested["--rdzv-backend"] == "c10d"
        assert shown["--max-restarts"] == tested["--max-restarts"] == "0"
