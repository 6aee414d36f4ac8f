"""After a session-owned teardown, megatron-core's module globals are as before the first session.

Each scenario runs in a fresh interpreter (this file as a script), so "before" is a
process in which no session ever ran: it imports what the session will use, snapshots
every ``megatron.core`` module global, runs ``pretrain`` on a world of one (gloo) with
a model on megatron-core's tensor-parallel layers that seeds the tensor-parallel RNG
tracker and records a MoE aux loss, snapshots again and writes the comparison to
``report.json``. The globals reset are those the installed megatron-core release has
(``expected_leftovers``): one it should have and lacks fails here, never a silent skip.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.moe import moe_utils
from support.configs import GROUP_TIMEOUT_S, config_of_one
from support.launch import run_bounded
from support.megatron_snapshot import added, diff, snapshot
from torch import nn

from lifecycle import (
    DistributedConfig,
    FaultInjection,
    InjectedFault,
    Phase,
    PretrainConfig,
    Session,
    State,
    TorchActions,
    pretrain,
)
from lifecycle._torch.megatron import (
    LEFTOVERS,
    Leftover,
    expected_leftovers,
    megatron_version,
    missing_leftovers,
    reset_leftovers,
)

MOE_TRACKERS = ("_MOE_LAYER_WISE_LOGGING_TRACKER", "_MOE_METRICS_TRACKER")
(MOE_TRACKER,) = (leftover for leftover in expected_leftovers() if leftover.name in MOE_TRACKERS)
"""The MoE aux-loss tracker of the installed release (it moved in 0.18)."""

COVERED = (
    ("megatron.core.parallel_state", "_PIPELINE_GLOBAL_RANKS"),
    ("megatron.core.tensor_parallel.random", "_CUDA_RNG_STATE_TRACKER"),
    (MOE_TRACKER.module, MOE_TRACKER.name),
)
"""Globals a session here sets: the "before" snapshot must hold them, or a clean diff proves nothing."""

TRACKER_STATE = "model-parallel-rng"

# -- the scenarios (run in a fresh interpreter) ------------------------------------------------


class TensorParallelLM(nn.Module):
    """Embedding, column- and row-parallel linear layers from megatron-core; seeds the RNG tracker as a TP model does.

    ``model_parallel_cuda_manual_seed`` needs CUDA: the tracker's states are set directly.
    """

    def __init__(self, config: PretrainConfig) -> None:
        """Build on CPU for ``config.model``'s vocabulary, then give the tracker a model-parallel state."""
        super().__init__()
        vocab, hidden = config.model.vocab_size, config.model.hidden_size
        layers = TransformerConfig(
            num_layers=1,
            hidden_size=hidden,
            num_attention_heads=config.model.num_heads,
            use_cpu_initialization=True,
            gradient_accumulation_fusion=False,
        )
        init = nn.init.normal_
        self.embed = tensor_parallel.VocabParallelEmbedding(vocab, hidden, init_method=init, config=layers)
        self.up = tensor_parallel.ColumnParallelLinear(
            hidden, 2 * hidden, config=layers, init_method=init, bias=True, gather_output=False
        )
        self.down = tensor_parallel.RowParallelLinear(
            2 * hidden, vocab, config=layers, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False
        )
        tensor_parallel.get_cuda_rng_tracker().set_states({TRACKER_STATE: torch.get_rng_state()})

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits [batch, seq, vocab]."""
        hidden, _ = self.up(self.embed(tokens))
        logits, _ = self.down(torch.relu(hidden))
        out: torch.Tensor = logits
        return out


HELD: list[Any] = []
"""The MoE tracker objects a scenario's steps recorded into, held as a caller holding them would."""


def tracker_entries(tracker: Any) -> int:
    """How many metrics a MoE tracker holds (a dict up to 0.17, a ``MoEMetricsTracker`` from 0.18)."""
    return len(tracker if isinstance(tracker, dict) else tracker.metrics)


def forward_with_aux_loss(batch: dict[str, torch.Tensor], model: nn.Module) -> torch.Tensor:
    """Cross-entropy, also recorded as a MoE router records its load-balancing loss (with groups to reduce over)."""
    logits = model(batch["tokens"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
    moe_utils.save_to_aux_losses_tracker(
        "load_balancing_loss",
        loss.detach(),
        layer_number=1,
        num_layers=1,
        reduce_group=parallel_state.get_tensor_model_parallel_group(),
        avg_group=parallel_state.get_data_parallel_group(),
    )
    HELD.append(getattr(sys.modules[MOE_TRACKER.module], MOE_TRACKER.name))
    return loss


def run_session(directory: Path, provider: Callable[[PretrainConfig], nn.Module], **fields: Any) -> Session:
    """One ``pretrain`` call of two steps on a world of one; returns its session, closed or failed."""
    distributed = DistributedConfig(
        world_size=1, rank=0, master_addr="127.0.0.1", master_port=0, timeout_s=GROUP_TIMEOUT_S
    )
    config = config_of_one(directory, iterations=2, distributed=distributed, **fields)
    session = Session(TorchActions(config.distributed, config.parallel))
    with contextlib.suppress(InjectedFault):
        pretrain(config, forward_with_aux_loss, model_provider=provider, session=session)
    return session


def compared(before: dict[Any, Any], **facts: Any) -> dict[str, Any]:
    """What a scenario reports: the facts, the globals that differ from ``before`` and the new ones not at rest."""
    after = snapshot()
    missing = [f"{module}.{name}" for module, name in COVERED if (module, name) not in before]
    return {**facts, "missing": missing, "changed": diff(before, after), "added": added(before, after)}


def success(directory: Path, before: dict[Any, Any]) -> dict[str, Any]:
    """A session that trains two steps and closes."""
    session = run_session(directory, TensorParallelLM)
    held = [tracker_entries(tracker) for tracker in HELD]
    HELD.clear()
    return compared(before, state=session.state.value, held_tracker_entries_after=held)


def failure(directory: Path, before: dict[Any, Any]) -> dict[str, Any]:
    """A session that fails in its second training step."""
    session = run_session(directory, TensorParallelLM, fault=FaultInjection(Phase.STEP, rank=0, step=2))
    return compared(before, state=session.state.value)


def rng_tracker(directory: Path, before: dict[Any, Any]) -> dict[str, Any]:
    """Two sessions in turn; each model provider first asks megatron-core for the RNG tracker."""
    trackers: list[Any] = []  # held, so that no id is reused

    def provider(config: PretrainConfig) -> nn.Module:
        trackers.append(tensor_parallel.get_cuda_rng_tracker())
        trackers.append(sorted(trackers[-1].get_states()))  # the states it has when handed out
        return TensorParallelLM(config)

    states = [run_session(directory / str(n), provider).state.value for n in range(2)]
    first, first_states, second, second_states = trackers
    return compared(
        before,
        states=states,
        same_tracker=first is second,
        states_handed_out=[first_states, second_states],
        first_tracker_states_after=sorted(first.get_states()),
    )


SCENARIOS: dict[str, Callable[[Path, dict[Any, Any]], dict[str, Any]]] = {
    "success": success,
    "failure": failure,
    "rng_tracker": rng_tracker,
}

# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every scenario, one after another in one fresh interpreter, each compared with the state before the first.

    A fresh interpreter: earlier tests in this process leave megatron-core state behind.
    One for all: importing megatron-core is most of the cost. Comparing each with the
    state before the first session keeps a leftover of one scenario from hiding another's.
    """
    directory = tmp_path_factory.mktemp("megatron_clean")
    done = run_bounded([sys.executable, __file__, str(directory)], timeout=120, cwd=directory)
    assert done.returncode == 0, done.stdout
    found: dict[str, dict[str, Any]] = json.loads((directory / "report.json").read_text())
    return found


def run_scenario(name: str, reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report of scenario ``name``; fails unless the snapshot saw what the session sets."""
    report = reports[name]
    assert report["missing"] == [], report
    return report


def assert_as_before(report: dict[str, Any]) -> None:
    """No megatron.core global differs from before the session, and none appeared that is not at rest."""
    assert report["changed"] == [], "changed:\n" + "\n".join(report["changed"])
    assert report["added"] == [], "added:\n" + "\n".join(report["added"])


def test_snapshot_diff_names_what_changed_and_added_skips_resting_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """diff reports a changed value, a replaced object and a container filled in place; added skips None and empty."""
    fake = types.ModuleType("fake_core.state")
    state = vars(fake)
    state.update(RANKS=None, TRACKER=types.SimpleNamespace(), GROUPS={}, KEPT=types.SimpleNamespace(), run=print)
    monkeypatch.setitem(sys.modules, "fake_core.state", fake)
    before = snapshot("fake_core")
    state.update(RANKS=[0], TRACKER=types.SimpleNamespace(), NEW_EMPTY={}, NEW_SET=[1])
    state["GROUPS"]["dp"] = types.SimpleNamespace()
    after = snapshot("fake_core")
    changed = diff(before, after)
    assert [line.split(":")[0] for line in changed] == [
        "fake_core.state.RANKS",
        "fake_core.state.TRACKER",
        "fake_core.state.GROUPS",
    ]
    assert changed[0] == "fake_core.state.RANKS: None → [0]"
    assert added(before, after) == ["fake_core.state.NEW_SET = [1]"]
    assert ("fake_core.state", "run") not in before  # code is not state


def test_every_global_the_installed_release_should_have_exists() -> None:
    """Each global (and helper) the reset list expects for the installed megatron-core exists: a moved one fails."""
    assert missing_leftovers() == ()
    assert len(expected_leftovers()) > 15


def test_the_reset_list_follows_the_megatron_core_release() -> None:
    """0.16-0.17 reset the dict MoE tracker; 0.18+ the MoE metrics tracker via its destroy; 0.19 adds GTP state."""

    def names(version: tuple[int, int]) -> set[str]:
        return {leftover.name for leftover in expected_leftovers(version)}

    everywhere = {leftover.name for leftover in LEFTOVERS if leftover.since == (0, 16) and leftover.until is None}
    for version in ((0, 16), (0, 17), (0, 18), (0, 19)):
        assert everywhere <= names(version)
    assert names((0, 17)) - everywhere == {"_MOE_LAYER_WISE_LOGGING_TRACKER"}
    assert names((0, 18)) - everywhere == {"_MOE_METRICS_TRACKER"}
    assert names((0, 19)) - everywhere == {"_MOE_METRICS_TRACKER", "_GTP_GROUPED_BUF_PARITY_COUNTER", "_GTP_PARAMS"}
    helpers = {leftover.helper for leftover in expected_leftovers((0, 19))} - {None}
    assert helpers == {"destroy_moe_metrics_tracker", "reset_gtp_state"}
    assert megatron_version() >= (0, 16)


def test_a_global_missing_from_the_installed_release_is_named_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A global the list expects but megatron-core lacks fails missing_leftovers and makes reset_leftovers warn."""
    gone: Leftover = MOE_TRACKER
    module = sys.modules[gone.module]
    monkeypatch.delattr(module, gone.name)
    assert missing_leftovers() == (str(gone),)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reset_leftovers()
    assert [str(w.message) for w in caught if str(gone) in str(w.message)], [str(w.message) for w in caught]
    assert not hasattr(module, gone.name)  # not created


@pytest.mark.timeout(150)
def test_closed_session_leaves_megatron_core_as_before(reports: dict[str, dict[str, Any]]) -> None:
    """After a session that trains and closes, every megatron.core module global equals its value before."""
    report = run_scenario("success", reports)
    assert report["state"] == State.CLOSED.value
    assert_as_before(report)
    # Emptied, not zeroed: a MoE tracker someone still holds keeps no loss and no group.
    held = report["held_tracker_entries_after"]
    assert held, "no step recorded into the MoE tracker"
    assert set(held) == {0}, held


@pytest.mark.timeout(90)
def test_failed_session_leaves_megatron_core_as_before(reports: dict[str, dict[str, Any]]) -> None:
    """After a session that fails in training, every megatron.core module global equals its value before."""
    report = run_scenario("failure", reports)
    assert report["state"] == State.FAILED.value
    assert_as_before(report)


@pytest.mark.timeout(90)
def test_next_session_gets_a_new_empty_rng_tracker(reports: dict[str, dict[str, Any]]) -> None:
    """A later session asking for the tensor-parallel RNG tracker gets a new one, without the earlier one's states."""
    report = run_scenario("rng_tracker", reports)
    assert report["states"] == [State.CLOSED.value] * 2
    assert report["same_tracker"] is False
    assert report["states_handed_out"] == [[], []]
    assert report["first_tracker_states_after"] == []  # reset: whoever kept it cannot fork the old states
    assert_as_before(report)


if __name__ == "__main__":
    directory = Path(sys.argv[1])
    pristine = snapshot()
    found = {name: scenario(directory / name, pristine) for name, scenario in SCENARIOS.items()}
    (directory / "report.json").write_text(json.dumps(found))
