"""Store work per rank is bounded, whatever the world size: attempt agreement and the failure notice (issue 29).

W simulated ranks (threads, each with its own real ``TCPStore`` client, wrapped to
count its requests) against one server, at W = 64 and 256. On the code before issue 29
a waiting rank polled the store about 30 times a second, and a rank that timed out read
every peer's proposal one key at a time (about 2·W requests each): every test here that
bounds a count fails there.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict

import pytest
from support.counting_store import CountingStore, ranks, run_ranks, server
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from lifecycle import AttemptDisagreement
from lifecycle._torch import notice
from lifecycle._torch.store import agree_attempt

WORLDS = (64, 256)


@pytest.fixture(scope="module")
def host() -> TCPStore:
    """One store server for the module."""
    return server()


@pytest.fixture(scope="module")
def clients(host: TCPStore) -> list[CountingStore]:
    """256 counting clients of ``host`` (a test at W uses the first W)."""
    return ranks(host, max(WORLDS))


_generation = iter(range(1_000_000))


def _agree(stores: list[CountingStore], timeout_s: float, spread_s: float, absent: int | None = None) -> list[object]:
    """Every rank but ``absent`` agrees, arriving at a random moment within ``spread_s``; each rank's result."""
    generation = next(_generation)  # a fresh namespace on the shared server
    world = len(stores)

    def one(rank: int, store: CountingStore) -> object:
        if rank == absent:
            return None
        time.sleep(random.uniform(0, spread_s))
        store.reset()  # counted from the agreement's first request on
        return agree_attempt(
            store, rank=rank, world_size=world, proposal=0, generation=generation, timeout_s=timeout_s, where="t"
        )

    return run_ranks(stores, one, join_s=timeout_s + spread_s + 30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
def test_agreement_costs_each_rank_three_store_requests_the_deciding_one_five(
    clients: list[CountingStore], world: int
) -> None:
    """Every rank present, arriving over 0.5 s: one decides (5 requests), every other waits on one key (3)."""
    stores = clients[:world]
    results = _agree(stores, timeout_s=30, spread_s=0.5)
    assert results == [0] * world
    ops = sorted(store.ops for store in stores)
    assert ops[-1] <= 5 and ops[-2] <= 3, ops[-5:]  # old code: 9 to 90 each
    assert sum(ops) <= 3 * world + 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
def test_agreement_with_a_rank_missing_costs_each_rank_five_requests_and_one_gathers_the_proposals(
    clients: list[CountingStore], world: int
) -> None:
    """Rank 0 never comes: each other rank times out after 5 requests; the last to give up reads every proposal once."""
    stores = clients[:world]
    results = _agree(stores, timeout_s=1.0, spread_s=0.2, absent=0)
    errors = results[1:]
    assert all(isinstance(error, AttemptDisagreement) for error in errors), errors[:3]
    complete = [e for e in errors if isinstance(e, AttemptDisagreement) and len(e.proposals) == world]
    assert len(complete) == 1  # one rank lists every rank's proposal ...
    (gathered,) = complete
    assert gathered.proposals == {0: None, **dict.fromkeys(range(1, world), 0)}
    assert f"no proposal: rank 0; proposed 0: ranks 1-{world - 1}" in str(gathered)
    for error in errors:  # ... and the others say where to read it
        if error is not gathered:
            assert "the last rank to give up lists every rank's proposal" in str(error), str(error)
    ops = sorted(store.ops for store in stores[1:])
    assert ops[-1] <= 7 and ops[-2] <= 5, ops[-5:]  # old code: about 2·W each
    assert sum(ops) <= 5 * (world - 1) + 2


@pytest.mark.timeout(120)
def test_agreement_lifts_every_rank_to_the_highest_proposal_at_four_requests_a_rank_ahead(
    clients: list[CountingStore],
) -> None:
    """Ranks propose 0, 1 or 2: all take 2; a rank ahead of the floor writes its proposal once more (4)."""
    stores = clients[:64]
    generation = next(_generation)
    proposals = [rank % 3 for rank in range(64)]

    def one(rank: int, store: CountingStore) -> object:
        time.sleep(random.uniform(0, 0.3))
        store.reset()
        return agree_attempt(
            store, rank=rank, world_size=64, proposal=proposals[rank], generation=generation, timeout_s=30, where="t"
        )

    assert run_ranks(stores, one, join_s=60) == [2] * 64
    ops = sorted(store.ops for store in stores)
    assert ops[-1] <= 6 and ops[-2] <= 4, ops[-5:]
    # The next agreement on the store starts above what was used, at three requests a waiting rank again.
    assert (
        run_ranks(
            stores,
            lambda rank, store: agree_attempt(
                store, rank=rank, world_size=64, proposal=0, generation=generation, timeout_s=30, where="t"
            ),
            join_s=60,
        )
        == [3] * 64
    )
    ops = sorted(store.ops for store in stores)
    assert ops[-1] <= 5 and ops[-2] <= 3, ops[-5:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_failing_at_once_costs_each_three_store_requests(clients: list[CountingStore], world: int) -> None:
    """All W ranks publish a notice at once: numbers 1..W, each rank 3 requests (count, write, read notice 1)."""
    stores = clients[:world]
    prefix = f"notices-{next(_generation)}"

    def one(rank: int, store: CountingStore) -> object:
        error = RuntimeError(f"rank {rank} broke")
        return notice.publish(
            store, prefix, name="the store", rank=rank, error=error, phase="step", step=3, at=time.time(), deadline_s=30
        )

    results = run_ranks(stores, one, join_s=60)
    assert sorted(r.seq for r in results) == list(range(1, world + 1)), results[:3]
    first = next(rank for rank, r in enumerate(results) if r.seq == 1)
    assert all(r.first_rank == first for r in results if r.seq != 1)
    ops = [store.ops for store in stores]
    assert max(ops) <= 3, sorted(ops)[-5:]


@pytest.mark.timeout(60)
def test_a_publish_past_its_deadline_takes_no_number(clients: list[CountingStore]) -> None:
    """A notice whose worker starts after the deadline is not counted: it cannot take number 1 after the fact."""
    store = clients[0]
    prefix = f"notices-{next(_generation)}"
    mine = notice.FailureNotice(5, "h", 1, "step", 3, "RuntimeError: late", time.time(), seq=0)
    outcome = notice._publish(store, prefix, "the store", mine, deadline=time.monotonic() - 0.001)
    assert outcome.seq is None and "deadline" in outcome.unpublished, outcome
    assert store.inner.add(f"{prefix}/{notice.NAMESPACE}/count", 0) == 0  # old code: 1, rank 5 numbered first


@pytest.mark.timeout(60)
def test_a_notice_numbered_after_its_deadline_is_not_named_first(clients: list[CountingStore]) -> None:
    """A notice counted after its rank's deadline is written as late: a later rank does not name its rank first."""
    store = clients[0]
    prefix = f"notices-{next(_generation)}"
    keys = PrefixStore(prefix, store)
    late = notice.FailureNotice(7, "h", 1, "step", 3, "ConnectionError: Connection reset by peer", time.time(), seq=1)
    store.inner.add(f"{prefix}/{notice.NAMESPACE}/count", 1)
    keys.set(f"{notice.NAMESPACE}/1", json.dumps({**asdict(late), "late": True}))
    outcome = notice.publish(
        store, prefix, name="the store", rank=2, error=RuntimeError("real"), phase="step", step=3, at=time.time()
    )
    assert outcome.seq == 2 and outcome.first_rank is None, outcome
    assert "rank 7's notice 1 was numbered after its deadline" in outcome.note, outcome.note
