"""The plugin's fixtures, used directly by this suite: factories that tear down whatever the test did.

Before the plugin there were no such fixtures (each test below errored: fixture not found).
"""

from __future__ import annotations

from typing import Any

import pytest

from lifecycle import State
from lifecycle.testing import alive
from lifecycle.testing.factories import MegatronParallelFactory, SessionFactory
from lifecycle.testing.world import World


def test_a_session_left_live_by_the_test_is_failed_by_the_factory(session: SessionFactory) -> None:
    """A session the test leaves in ``training`` takes the failure edge at the factory's close: nothing stays alive."""
    run = session()
    run.init_distributed()
    run.init_globals()
    run.start_training()
    assert alive()["process_group"] and alive()["model_parallel"]
    session.close()  # what the fixture's teardown does
    assert run.state is State.FAILED
    assert not any(alive().values())


def test_megatron_parallel_initialises_and_always_destroys(megatron_parallel: MegatronParallelFactory) -> None:
    """``megatron_parallel()`` returns the initialised ``parallel_state``; ``close`` destroys it and the group."""
    state: Any = megatron_parallel(tp=1, pp=1)
    assert state.model_parallel_is_initialized()
    assert state.get_data_parallel_world_size() == 1
    megatron_parallel.close()
    assert not state.model_parallel_is_initialized()
    assert not alive()["process_group"]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.world(2, timeout=90)
def test_two_ranks_all_reduce_in_sessions(world: World, session: SessionFactory) -> None:
    """On two ranks of a world, each rank's session trains, all-reduces and closes (this suite's own world test)."""
    import torch
    import torch.distributed as dist

    with session() as run:
        run.init_distributed()
        run.init_globals()
        run.start_training()
        total = torch.tensor([float(world.rank + 1)])
        dist.all_reduce(total)
        assert total.item() == 3
    assert run.state is State.CLOSED
