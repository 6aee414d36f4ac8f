"""The ``transitions`` adapter: the only module of the package that imports ``transitions``.

Two machines are built here from ``TRANSITIONS`` and nothing else (no auto-generated
``to_<state>`` edges, no wildcard sources, invalid triggers raise): the ``Driver``'s
runtime machine, and a ``GraphMachine`` that draws the table with transitions' Graphviz
engine (``dot_source``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any, Protocol, cast

from transitions import Machine, MachineError

from lifecycle._core.errors import InvalidTransition
from lifecycle._core.states import State, Trigger
from lifecycle._core.table import TRANSITIONS, Edge


def _run_work(work: Callable[[], bool]) -> bool:
    """The condition of every runtime edge: the caller's work, passed along as the trigger's argument."""
    return work()


# Built once and shared by every Driver: a machine only unpacks these dicts, never changes them.
_RUNTIME_EDGES: tuple[dict[str, Any], ...] = tuple(
    {"trigger": e.trigger.value, "source": e.source, "dest": e.dest, "conditions": _run_work} for e in TRANSITIONS
)


class _Model:
    """The bare object a machine drives: it defines nothing, so transitions binds its methods without overriding."""

    state: State


class Driver:
    """One session's state, driven by a transitions Machine built from TRANSITIONS only.

    No auto transitions, no wildcard, invalid triggers raise.
    """

    __slots__ = ("_machine", "_model")

    def __init__(self) -> None:
        """A new driver in ``State.UNINITIALIZED``."""
        self._model = _Model()
        self._machine = Machine(
            model=self._model,
            states=list(State),
            transitions=_RUNTIME_EDGES,
            initial=State.UNINITIALIZED,
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )

    @property
    def state(self) -> State:
        """The current state."""
        return self._model.state

    def fire(self, trigger: Trigger, work: Callable[[], bool]) -> bool:
        """Take ``trigger``'s edge from the current state, running ``work`` inside the transition.

        If the machine declares no edge for ``trigger`` here, raise ``InvalidTransition(state,
        trigger)`` before calling ``work``. Otherwise call ``work()`` exactly once, as the
        edge's condition: if it raises, the state is unchanged and the very exception object
        propagates (``BaseException`` included); if it returns False, the state is unchanged
        and ``fire`` returns False; if True, the state moves to the edge's destination and
        ``fire`` returns True. A ``MachineError`` raised inside ``work`` propagates as itself.
        """
        entered = False

        def inside() -> bool:
            nonlocal entered
            entered = True
            return work()

        event = self._machine.events.get(trigger.value)
        if event is None:  # no edge anywhere for this trigger: transitions knows no such event
            raise InvalidTransition(self.state, trigger)
        try:
            return event.trigger(self._model, inside)
        except MachineError:
            if entered:  # raised by (something called from) work, not by the validity check
                raise
            raise InvalidTransition(self.state, trigger) from None

    def force_failed(self) -> None:
        """Put the state to ``failed`` without an edge: only for a failure teardown an interrupt cut short.

        An interrupt that lands inside the machine's own code (after the teardown ran,
        before the state was set) must not leave the session live.
        """
        self._machine.set_state(State.FAILED, model=self._model)


class _Digraph(Protocol):
    """What ``dot_source`` uses of the ``graphviz.Digraph`` that transitions' Graphviz engine returns."""

    @property
    def source(self) -> str: ...

    def node(self, name: str, label: str | None = None, **attrs: str) -> None: ...

    def edge(self, tail_name: str, head_name: str, label: str | None = None, **attrs: str) -> None: ...


def dot_source(taken: Collection[Edge] = ()) -> str:
    """The Graphviz ``dot`` text of ``TRANSITIONS``, drawn by transitions' Graphviz engine.

    Needs the ``graphviz`` Python package (raises ``ImportError`` naming ``pip install
    graphviz`` without it), never the ``dot`` program. Nodes are the state values, each
    edge is labelled with its trigger, a point marks the initial state, final states have
    a double border, edges in ``taken`` are drawn bold and coloured, and no current state
    is styled. The same table and ``taken`` always give the same text.
    """
    try:
        importlib.import_module("graphviz")
    except ImportError as exc:
        raise ImportError(
            "drawing lifecycle.dot needs the graphviz Python package (transitions' Graphviz engine): "
            "pip install graphviz"
        ) from exc
    from transitions.extensions.diagrams import GraphMachine

    model = _Model()
    machine = GraphMachine(
        model=model,
        states=[{"name": s.value, "final": s.is_final} for s in State],
        transitions=[{"trigger": e.trigger.value, "source": e.source.value, "dest": e.dest.value} for e in TRANSITIONS],
        initial=State.UNINITIALIZED.value,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        title="lifecycle",
        graph_engine="graphviz",
    )
    # Instance attributes: assigning replaces transitions' class-level defaults for this machine only.
    machine.machine_attributes = {"rankdir": "LR"}
    machine.style_attributes = {
        "graph": {"default": {"fontname": "Helvetica"}},
        "node": {
            "default": {"shape": "box", "style": "rounded", "fontname": "Helvetica"},
            "final": {"peripheries": "2"},
        },
        "edge": {
            "default": {"fontname": "Helvetica", "fontsize": "10"},
            "previous": {"color": "#e65100", "penwidth": "2.5"},  # transitions calls a taken edge "previous"
        },
    }
    graph = machine.model_graphs[id(model)]
    graph.reset_styling()  # drop the "active" style transitions gives the model's current state
    for edge in TRANSITIONS:  # a taken edge's source is tagged "previous" too: no node style has that name
        if edge in taken:
            graph.set_previous_transition(edge.source.value, edge.dest.value)
    for name, state in machine.states.items():
        if state.final:
            graph.set_node_style(name, "final")
    drawing = cast(_Digraph, graph.get_graph())
    drawing.node("start", label="", shape="point")
    drawing.edge("start", str(machine.initial))
    return drawing.source
