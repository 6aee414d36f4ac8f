"""Config values are checked by one helper, and every error names its field by one convention: ``section.field``."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from lifecycle import ConfigError, PretrainConfig
from lifecycle._core.errors import check_number


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (0, {"at_least": 1}, "must be an integer >= 1, got 0"),
        (True, {"at_least": 0}, "must be an integer >= 0, got True"),
        (2.0, {"at_least": 0}, "must be an integer >= 0, got 2.0"),
        ("3", {}, "must be an integer, got '3'"),
        (None, {}, "must be an integer, got None"),
        (70000, {"at_least": 0, "at_most": 65535}, "must be an integer in 0..65535, got 70000"),
        (0.0, {"integer": False, "above": 0, "unit": "seconds"}, "must be a finite number of seconds > 0, got 0.0"),
        (math.nan, {"integer": False, "above": 0}, "must be a finite number > 0, got nan"),
        (math.inf, {"integer": False}, "must be a finite number, got inf"),
    ],
)
def test_a_value_out_of_bounds_or_of_another_type_is_refused_saying_what_was_expected(
    value: object, bounds: dict[str, typing.Any], message: str
) -> None:
    """check_number raises ConfigError(field, message): a bool is no integer, a float no integer, nan no number."""
    with pytest.raises(ConfigError) as caught:
        check_number("section.name", value, **bounds)
    assert (caught.value.field, caught.value.message) == ("section.name", message)


@pytest.mark.parametrize(
    ("value", "bounds"),
    [
        (1, {"at_least": 1}),
        (65535, {"at_least": 0, "at_most": 65535}),
        (0.5, {"integer": False, "above": 0}),
        (3, {"integer": False, "above": 0}),
        (None, {"at_least": 1, "optional": True}),
    ],
)
def test_a_value_within_the_bounds_passes(value: object, bounds: dict[str, typing.Any]) -> None:
    """Bounds are inclusive (at_least, at_most) or exclusive (above); an int is a number; optional lets None pass."""
    check_number("section.name", value, **bounds)


def _sections() -> list[tuple[str, type[typing.Any]]]:
    """Each section of PretrainConfig (its name, its class), derived from the annotations."""
    hints = typing.get_type_hints(PretrainConfig)
    found = []
    for field in dataclasses.fields(PretrainConfig):
        kinds = [k for k in typing.get_args(hints[field.name]) or (hints[field.name],) if dataclasses.is_dataclass(k)]
        found += [(field.name, kind) for kind in kinds]
    return found


def _numeric_fields() -> list[tuple[str, type[typing.Any], str]]:
    """(section, class, field) for every int or float field of every section."""
    found = []
    for section, cls in _sections():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            kinds = set(typing.get_args(hints[field.name]) or (hints[field.name],))
            if kinds & {int, float} and bool not in kinds:
                found.append((section, cls, field.name))
    return found


@pytest.mark.parametrize(("section", "cls", "name"), _numeric_fields(), ids=lambda x: getattr(x, "__name__", x))
def test_every_numeric_config_field_is_checked_and_named_section_dot_field(
    section: str, cls: type[typing.Any], name: str
) -> None:
    """A non-number in any numeric field of any PretrainConfig section: ConfigError naming ``section.field``."""
    required = {"phase": "step"} if section == "fault" else {}
    with pytest.raises(ConfigError) as caught:
        cls(**required, **{name: "not a number"})
    assert caught.value.field == f"{section}.{name}"


def test_the_sections_are_found() -> None:
    """The walk above sees every section, so a new one is checked without editing the test."""
    names = {"distributed", "parallel", "model", "training", "checkpoint", "exit", "fault"}
    assert {section for section, _ in _sections()} >= names
    assert len(_numeric_fields()) > 20


@pytest.mark.parametrize("section", [f.name for f in dataclasses.fields(PretrainConfig) if f.name != "journal_dir"])
@pytest.mark.parametrize("value", [None, "x", 3])
def test_a_section_of_the_wrong_type_is_refused_naming_it(section: str, value: object) -> None:
    """``PretrainConfig(checkpoint=None)`` and the like: ConfigError naming the section (before: accepted)."""
    if section == "fault" and value is None:
        assert PretrainConfig(fault=None).fault is None  # the one section that may be None
        return
    with pytest.raises(ConfigError) as caught:
        PretrainConfig(**{section: value})
    assert caught.value.field == section
    assert repr(value) in caught.value.message


@pytest.mark.parametrize("value", ["", 3, b"dir"])
def test_a_journal_dir_that_is_not_a_non_empty_string_is_refused(value: object) -> None:
    """``journal_dir=""`` would write journals to the current folder: refused, as is a non-string."""
    with pytest.raises(ConfigError) as caught:
        PretrainConfig(journal_dir=value)  # type: ignore[arg-type]
    assert caught.value.field == "journal_dir"
