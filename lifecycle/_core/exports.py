"""Public paths for exported names: each class and function reads as the module users import it from.

A public module ends with ``publish(globals())``; one with lazy names (loaded by its
``__getattr__``) calls ``publish_one`` on each as it loads. This is trio's
``fixup_module_metadata``: a traceback, a repr and a docs tool print
``lifecycle.InjectedFault``, not ``lifecycle._training.config.InjectedFault``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["publish", "publish_one"]


def publish(namespace: Mapping[str, Any]) -> None:
    """Give each name in ``namespace['__all__']`` that is present the public path ``namespace['__name__']``.

    Names not loaded yet (lazy ones) are skipped: ``publish_one`` does them when they load.
    """
    module = namespace["__name__"]
    for name in namespace["__all__"]:
        if name in namespace:
            publish_one(namespace[name], module, name)


def publish_one(value: object, module: str, name: str) -> None:
    """Set ``value.__module__`` to ``module`` and its ``__qualname__`` to ``name`` if it is defined in a private module.

    Only classes and functions defined under a private path (a component starting with
    ``_``) change; a value already public, or defined outside ``lifecycle``, is left alone.
    The object stays the same, so ``isinstance``, ``except`` and identity are unaffected;
    pickling finds it by its new path, which exports it under ``name``. A class's own
    annotations are resolved first, where they resolve, in the module that defines them,
    so that ``typing.get_type_hints`` (which evaluates a class's string annotations in the
    module its ``__module__`` names) gives what it gave before.
    """
    if not isinstance(value, type | types.FunctionType):
        return
    home = getattr(value, "__module__", None)
    if not isinstance(home, str) or not home.startswith("lifecycle.") or not _private(home):
        return
    if isinstance(value, type):
        _resolve_annotations(value)
    value.__module__ = module
    value.__qualname__ = name


def _private(module: str) -> bool:
    """Whether ``module`` is private: one of its components starts with ``_``."""
    return any(part.startswith("_") for part in module.split("."))


def _resolve_annotations(cls: type) -> None:
    """Replace ``cls``'s own string annotations with the objects they name, evaluated where ``cls`` was defined.

    Left as they are when they do not resolve there (a name imported only for type
    checking): ``get_type_hints`` failed on them before, and still does.
    """
    own = inspect.get_annotations(cls)
    if not own:
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable before the move too; nothing to preserve
        return
    cls.__annotations__ = {key: hints[key] for key in own}
