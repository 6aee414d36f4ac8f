"""The ``transitions`` adapter: the only module of the package that imports ``transitions``.

It builds the runtime machine from ``TRANSITIONS`` and nothing else: no auto-generated
``to_<state>`` edges, no wildcard sources, invalid triggers raise.
"""

from __future__ import annotations

import logging

from transitions import Machine

from lifecycle._core.states import State
from lifecycle._core.table import TRANSITIONS


class TriggerModel:
    """The object ``transitions`` drives.

    Its triggers are declared here so they type-check; with ``model_override=True``
    transitions replaces exactly these, and binds nothing else.
    """

    state: State

    def init_distributed(self) -> bool:
        raise NotImplementedError

    def init_globals(self) -> bool:
        raise NotImplementedError

    def start_training(self) -> bool:
        raise NotImplementedError

    def finish(self) -> bool:
        raise NotImplementedError

    def close(self) -> bool:
        raise NotImplementedError

    def fail(self) -> bool:
        raise NotImplementedError


def _drop_override_notices(record: logging.LogRecord) -> bool:
    # With model_override=True, transitions logs a warning for every convenience method
    # it does not bind (is_<state>, may_<trigger>, ...). Not binding them is the point.
    return "due to model override policy" not in record.getMessage()


logging.getLogger("transitions.core").addFilter(_drop_override_notices)


def build_machine(model: TriggerModel) -> Machine:
    """The ``transitions`` machine of ``TRANSITIONS`` driving ``model``: only declared edges, no auto transitions."""
    return Machine(
        model=model,
        states=list(State),
        transitions=[{"trigger": e.trigger.value, "source": e.source, "dest": e.dest} for e in TRANSITIONS],
        initial=State.UNINITIALIZED,
        auto_transitions=False,
        model_override=True,
        ignore_invalid_triggers=False,
    )
