"""Records of schema versions 1, 2 and 3, read as version 4 records.

Version 3 had the same records as version 4 without the typed evidence (``evidence``,
``first``, ``killed``; read as None, None, False) and called the ``hang`` verdict
``waiting``; ``from_v3`` renames it. The prose of a version 3 note is read by ``show``
(``lifecycle._tools.show.older``), never here.

Version 2 had the same records with two fields of prose: a teardown step's ``step``
was ``kind:name`` (``release_user_resource:cache``), and a left resource's
``resource`` was ``kind:name (owner: x)``; version 3 holds the kind, the name and the
owner in fields of their own. Version 1 had no ``version``, no run id, and times as
``at`` plus ``duration_s``; its ``end`` record carried the call's losses.
``docs/journal.md`` says how each old field maps onto version 3.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lifecycle.journal._records import Eval, Record, TrainStep, build
from lifecycle.journal._schema import brief

V1_RUN_ID = "v1"
"""The ``run_id`` of records read from a version 1 journal, which had none."""


V3_VERDICTS = {"waiting": "hang"}
"""Version 3's verdict names that version 4 renamed (one name per concept: the fault flag's)."""


def from_v3(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The version 4 JSON object for the version 3 (or older, converted) object ``data``: a ``waiting`` verdict
    reads as ``hang``; every other field as it was (the new ones take their defaults)."""
    if data.get("kind") == "verdict" and data.get("verdict") in V3_VERDICTS:
        return {**data, "verdict": V3_VERDICTS[data["verdict"]]}
    return data


def from_v2(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The version 3 JSON object for the version 2 (or converted version 1) object ``data``.

    Only ``teardown`` and ``left`` records changed: ``step`` ``kind:name`` becomes
    ``step`` and ``name``; ``resource`` ``kind:name (owner: x)`` becomes ``resource``
    and ``name`` (the owner is in its own field already). A field of the wrong type is
    left for the version 3 checks to name.
    """
    kind = data.get("kind")
    if kind == "teardown" and isinstance(data.get("step"), str) and "name" not in data:
        step, _, name = data["step"].partition(":")
        return {**data, "step": step, "name": name}
    if kind == "left" and isinstance(data.get("resource"), str) and "name" not in data:
        resource: str = data["resource"]
        owner = data.get("owner")
        suffix = f" (owner: {owner})"
        if isinstance(owner, str) and resource.endswith(suffix):
            resource = resource[: -len(suffix)]
        label, _, name = resource.partition(":")
        return {**data, "resource": label, "name": name}
    return data


def _number(data: Mapping[str, Any], key: str) -> float:
    """``data[key]``, a number (``KeyError`` if absent); ``ValueError`` ``field 'key' ...`` if of another type."""
    value = data[key]
    if type(value) not in (int, float):
        raise ValueError(f"field {key!r} must be float, got {brief(value)}")
    return float(value)


def from_v1(data: Mapping[str, Any], run: Mapping[str, Any] | None) -> list[Record]:
    """The records for version 1 record ``data``; ``run`` is the file's last v1 ``run`` record before it.

    A v1 ``end`` record becomes its ``TrainStep`` and ``Eval`` records (no times) and a
    ``RunEnd``. ``ValueError`` (``field 'x' ...`` where a field is to blame) if ``data``
    is not a v1 record.
    """
    if "kind" not in data:
        raise ValueError("field 'kind' is missing: not a journal record (nor field 'version')")
    run = data if data["kind"] == "run" else (run or {})
    origin = {
        "run_id": V1_RUN_ID,
        **{key: data[key] for key in ("rank", "attempt") if key in data},
        "restart_mode": run.get("restart_mode", "ordinary"),
        "iteration": run.get("iteration", 0),
    }
    kind = data["kind"]
    both = {**data, **origin}
    try:
        if kind == "transition":  # v1: ``at`` when the state changed
            at, took = _number(data, "at"), _number(data, "duration_s")
            return [build({**both, "start": at - took, "end": at})]
        if kind == "teardown":  # v1: ``at`` when the step started
            at, took = _number(data, "at"), _number(data, "duration_s")
            return [build(from_v2({**both, "start": at, "end": at + took}))]
        if kind == "end":
            out: list[Record] = []
            for record_kind, key in ((TrainStep.kind, "losses"), (Eval.kind, "eval_losses")):
                pairs = data[key]
                if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                    raise ValueError(f"field {key!r} must be a list of [step, loss] pairs, got {brief(pairs)}")
                out += [
                    build({**origin, "kind": record_kind, "step": s, "loss": v, "start": None, "end": None})
                    for s, v in pairs
                ]
            return [*out, build({**both, "end": None})]
        if kind in ("run", "left"):
            return [build(from_v2(both))]
    except KeyError as exc:
        raise ValueError(f"field {exc.args[0]!r} is missing (a version 1 {kind!r} record)") from None
    except TypeError as exc:
        raise ValueError(f"bad version 1 {brief(kind)} record: {exc}") from None
    raise ValueError(f"field 'kind' is {brief(kind)}: unknown version 1 record kind")
