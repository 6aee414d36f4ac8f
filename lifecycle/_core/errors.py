"""The library's errors. Every one derives from ``LifecycleError``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lifecycle._core.states import State


class LifecycleError(Exception):
    """Base class of every error this library raises."""


class InvalidTransition(LifecycleError):
    """A trigger was pulled in a state that declares no edge for it; nothing was done."""

    def __init__(self, state: State, trigger: str) -> None:
        self.state = state
        self.trigger = trigger
        super().__init__(f"trigger {trigger!r} is not valid in state {state.value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuild from the constructor's arguments (copy, pickle: NVRx's Wrapper copies
        # the exception of a failed iteration); the instance dict carries any notes.
        return (type(self), (self.state, self.trigger), self.__dict__)


class ConfigError(LifecycleError, ValueError):
    """A configuration value is invalid; raised before anything is acquired."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.field, self.message), self.__dict__)
