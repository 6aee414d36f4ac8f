"""Ranks agree on the attempt through the store, and the store a session opens is owned and closed by it."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.launch import run_workers
from torch.distributed import DistNetworkError, Store, TCPStore  # type: ignore[attr-defined]

from lifecycle import AttemptDisagreement
from lifecycle._torch.store import agree_attempt


def host(port: int = 0, world: int = 2) -> TCPStore:
    """A store server on loopback (``port`` 0: any free one)."""
    return TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def client(port: int, timeout_s: float = 10.0) -> TCPStore:
    """A client of the server on ``port``."""
    return TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))


def agree_all(stores: list[Store], proposals: list[int], timeout_s: float = 10.0) -> list[Any]:
    """Run ``agree_attempt`` for every rank at once (one thread each); return each rank's attempt or error."""
    results: list[Any] = [None] * len(stores)

    def one(rank: int) -> None:
        try:
            results[rank] = agree_attempt(
                stores[rank],
                rank=rank,
                world_size=len(stores),
                proposal=proposals[rank],
                timeout_s=timeout_s,
                where="test",
            )
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(rank,)) for rank in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 5)
    return results


@pytest.mark.timeout(60)
def test_ranks_that_propose_different_attempts_all_join_the_highest() -> None:
    """A rank two attempts ahead is joined by the others (a per-process counter left them apart for good)."""
    server = host(world=3)
    stores: list[Store] = [server, client(server.port), client(server.port)]
    assert agree_all(stores, [0, 2, 1]) == [2, 2, 2]
    # A later round on the same store: a rank proposing an old number is lifted above what was used.
    assert agree_all(stores, [0, 0, 3]) == [3, 3, 3]
    assert agree_all(stores, [0, 0, 0]) == [4, 4, 4]  # never 2 or 3 again: those prefixes hold keys


@pytest.mark.timeout(60)
def test_ranks_that_cannot_meet_fail_naming_each_rank_and_its_proposal() -> None:
    """Without its peers a rank fails at the timeout with every rank's proposal (or its absence)."""
    server = host(world=3)
    with pytest.raises(AttemptDisagreement) as info:
        agree_attempt(server, rank=0, world_size=3, proposal=5, timeout_s=0.5, where="127.0.0.1:1")
    assert info.value.proposals == {0: 5, 1: None, 2: None}
    assert "rank 0" in str(info.value) and "no proposal: ranks 1-2" in str(info.value)


@pytest.mark.timeout(60)
def test_a_store_that_goes_away_during_the_agreement_is_raised() -> None:
    """A peer whose host went away gets the store's error at once: it is never carried into the host's next attempt."""
    server = host()
    peer = client(server.port)
    del server
    with pytest.raises(DistNetworkError):
        agree_attempt(peer, rank=1, world_size=2, proposal=0, timeout_s=5, where="t")


def _results(tmp_path: Path) -> dict[int, dict[str, Any]]:
    return {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_two_attempts_ahead_meets_its_peer_and_both_close(tmp_path: Path) -> None:
    """Rank 1 fails twice while rank 0 is in setup; the next attempt closes on both (old code: prefixes apart)."""
    results = run_workers("agreement_worker", "behind", str(tmp_path), timeout_s=100)
    assert all(r.returncode == 0 for r in results), [r.output[-3000:] for r in results]
    ranks = _results(tmp_path)
    zero, one = ranks[0]["attempts"], ranks[1]["attempts"]
    assert one[0]["error"] == "PlannedFailure"
    assert one[1]["state"] == "failed"  # gave up while rank 0 was still in setup
    assert len(one) >= 3 and len(zero) >= 2
    assert zero[-1]["state"] == one[-1]["state"] == "closed"
    assert zero[-1]["prefix"] == one[-1]["prefix"] and zero[-1]["attempt"] == one[-1]["attempt"]
    assert not ranks[0]["listening_after"]  # every store rank 0 hosted was closed by its session


@pytest.mark.timeout(120)
def test_a_store_host_failing_in_init_releases_its_peer_at_once_and_leaves_no_listener(tmp_path: Path) -> None:
    """The host's failure reaches the waiting peer in seconds, naming the host; roles then swap on the same port."""
    results = run_workers("agreement_worker", "host-fails", str(tmp_path), timeout_s=100)
    assert all(r.returncode == 0 for r in results), [r.output[-3000:] for r in results]
    ranks = _results(tmp_path)
    host_first, peer_first = ranks[0]["first"], ranks[1]["first"]
    assert host_first["error"] == "PlannedFailure" and not host_first["listening_after"]
    assert peer_first["state"] == "failed" and peer_first["seconds"] < 10  # the group timeout is 30 s
    assert any("hosted by rank 0" in note for note in peer_first["notes"]), peer_first
    # Old code: the new rank 0 got EADDRINUSE, the old one's server still held the port.
    assert ranks[0]["second"]["state"] == ranks[1]["second"]["state"] == "closed"
    assert not ranks[0]["second"]["listening_after"] and not ranks[1]["second"]["listening_after"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_peer_never_rendezvouses_again_on_a_server_its_host_is_about_to_drop(tmp_path: Path) -> None:
    """Rank 1 starts its next session while rank 0 holds the last one's store: it waits for the next, both close."""
    results = run_workers("agreement_worker", "host-lingers", str(tmp_path), timeout_s=100)
    assert all(r.returncode == 0 for r in results), [r.output[-3000:] for r in results]
    ranks = _results(tmp_path)
    # Old code: rank 1 joined the lingering server, which went away under it (Connection reset by peer).
    assert [s["state"] for s in ranks[0]["sessions"]] == ["closed", "closed"], ranks[0]
    assert [s["state"] for s in ranks[1]["sessions"]] == ["closed", "closed"], ranks[1]
    assert ranks[1]["sessions"][1]["seconds"] > 1.0  # it waited for rank 0's next server
    assert ranks[0]["sessions"][1]["attempt"] == ranks[1]["sessions"][1]["attempt"]
    assert not ranks[0]["listening_after"]
