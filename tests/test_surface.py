"""The top level is what the docs' code uses: ``lifecycle.__all__`` is derived from the README, tutorial and how-to.

The derivation, from the ``python`` blocks and ``.py`` file blocks of those documents
(found as the docs tests find them, ``support.readme``):

1. every name the code imports from ``lifecycle`` or reads as ``lifecycle.NAME`` (a
   sub-package such as ``lifecycle.restart`` is its own public module, not a name);
2. then, until nothing new is found, the types (among the public names) that using those
   names puts in the user's hands:

   - a function's parameter and return annotations (``pretrain`` → its Protocols, ``PretrainResult``);
   - a configuration's fields: a dataclass the docs' code constructs, and each
     dataclass reached through such fields (``PretrainConfig`` → ``LivenessConfig`` → ``LivenessMode``);
   - a class the docs' code subclasses: the annotations of the methods it overrides (``Callback``'s hooks);
   - an error's fields: the annotations of an exception class's constructor;
   - the errors a name's contract names: every exception class a docstring of the name
     (the class's own, and its methods' and properties') writes as ````NAME````;
   - every subclass of ``LifecycleError`` not defined in a public sub-package: ``except
     LifecycleError`` catches it, so a caller meets it by name.

The rest of the library's exports are in ``lifecycle.lowlevel`` (pinned in test_exports.py).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import re
import sys
from collections.abc import Iterator
from typing import Any

from support.readme import REPO, Block, document_blocks

import lifecycle
import lifecycle.lowlevel

USER_DOCUMENTS = ("README.md", "docs/tutorial.md", "docs/howto.md")
"""The documents whose code defines the top level: the README, the tutorial and the how-to's."""


def docs_code() -> list[Block]:
    """The Python code of ``USER_DOCUMENTS``: their ``run: python`` blocks and their ``.py`` file blocks."""
    blocks = [block for name in USER_DOCUMENTS for block in document_blocks(REPO / name)]
    return [block for block in blocks if block.kind == "python" or block.name.endswith(".py")]


@dataclasses.dataclass
class DocsUse:
    """What the docs' code does with ``lifecycle``: the names it uses, constructs (calls) and subclasses."""

    used: set[str] = dataclasses.field(default_factory=set)
    constructed: set[str] = dataclasses.field(default_factory=set)
    subclassed: set[str] = dataclasses.field(default_factory=set)


def docs_use(sources: list[str]) -> DocsUse:
    """Read ``sources`` (Python code) with ``ast``: the names taken from ``lifecycle`` and how each is used.

    A name counts as from ``lifecycle`` when imported by ``from lifecycle import NAME`` (under
    its alias too) or read as ``lifecycle.NAME``; sub-packages (``restart``) are left out.
    """
    found = DocsUse()
    for source in sources:
        tree = ast.parse(source)
        local: dict[str, str] = {}  # the name in the code → the name in lifecycle
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "lifecycle" and node.level == 0:
                local.update({alias.asname or alias.name: alias.name for alias in node.names})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "lifecycle":
                local[ast.unparse(node)] = node.attr
        found.used |= set(local.values())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in local:
                found.constructed.add(local[ast.unparse(node.func)])
            if isinstance(node, ast.ClassDef):
                found.subclassed |= {local[ast.unparse(base)] for base in node.bases if ast.unparse(base) in local}
    for names in (found.used, found.constructed, found.subclassed):
        names -= {name for name in set(names) if importlib.util.find_spec(f"lifecycle.{name}") is not None}
    return found


def _all_subclasses(cls: type) -> Iterator[type]:
    """Every subclass of ``cls``, at any depth."""
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def candidates() -> dict[str, Any]:
    """Every name the top level may have to export, by name: ``lifecycle``'s and ``lowlevel``'s exports, then
    each public class and function the library's private modules define (so a name dropped from both lists,
    or a new error nobody exports, is still found)."""
    lifecycle.pretrain  # noqa: B018 - loads the training layer's modules
    pool = {name: getattr(lifecycle, name) for name in lifecycle.__all__}
    pool |= {name: getattr(lifecycle.lowlevel, name) for name in lifecycle.lowlevel.__all__}
    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("lifecycle._"):
            for name, value in vars(module).items():
                home = getattr(value, "__module__", None)
                defined = home == module_name or home in ("lifecycle", "lifecycle.lowlevel")  # here, or published
                if defined and not name.startswith("_") and (isinstance(value, type) or inspect.isfunction(value)):
                    pool.setdefault(name, value)
    return pool


def family() -> set[type]:
    """``LifecycleError`` and its subclasses, but those a public sub-package (``lifecycle.checkpoint``...) defines."""
    candidates()  # loads the training layer's modules, so their errors are subclasses by now
    errors = {lifecycle.LifecycleError, *_all_subclasses(lifecycle.LifecycleError)}
    return {error for error in errors if error.__module__ == "lifecycle" or error.__module__.startswith("lifecycle._")}


def _annotations(function: object) -> list[str]:
    """The parameter and return annotations of ``function``, as written (strings)."""
    try:
        signature = inspect.signature(function)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return []
    texts = [str(parameter.annotation) for parameter in signature.parameters.values()]
    return [*texts, str(signature.return_annotation)]


def _docstrings(value: object) -> list[str]:
    """The docstrings of ``value``: its own and, for a class, those of the methods and properties its body defines."""
    texts = [inspect.getdoc(value) or ""]
    if isinstance(value, type):
        for member in vars(value).values():
            target = member.fget if isinstance(member, property) else member
            if inspect.isfunction(target) or isinstance(member, (staticmethod, classmethod)):
                texts.append(inspect.getdoc(target) or "")
    return texts


def derived_top_level() -> set[str]:
    """The names ``lifecycle`` must export: those the docs' code uses, closed under the rules of this module's doc."""
    use = docs_use([block.text for block in docs_code()])
    pool = candidates()
    errors = {name for name, value in pool.items() if isinstance(value, type) and issubclass(value, BaseException)}
    names = set(use.used) | {error.__name__ for error in family()}
    configs = set(use.constructed)
    todo = list(names)
    while todo:
        name = todo.pop()
        value = pool[name]
        texts: list[str] = []
        if inspect.isfunction(value):
            texts += _annotations(value)
        if dataclasses.is_dataclass(value) and name in configs:
            texts += [str(field.type) for field in dataclasses.fields(value)]
        if name in use.subclassed and isinstance(value, type):
            hooks = [member for member in vars(value).values() if inspect.isfunction(member)]
            texts += [text for hook in hooks for text in _annotations(hook)]
        if name in errors:
            texts += _annotations(value.__init__)
        words = {word for text in texts for word in re.findall(r"[A-Za-z_]\w*", text)}
        if dataclasses.is_dataclass(value) and name in configs:
            configs |= {word for word in words if word in pool and dataclasses.is_dataclass(pool[word])}
        words |= {word for text in _docstrings(value) for word in re.findall(r"``(\w+)``", text) if word in errors}
        new = {word for word in words if word in pool} - names
        names |= new
        todo += new
    return names


def test_the_top_level_exports_exactly_what_the_docs_code_uses() -> None:
    """``lifecycle.__all__`` equals the derived list: nothing the docs need is missing, nothing else is there."""
    derived = derived_top_level()
    exported = set(lifecycle.__all__)
    assert sorted(exported - derived) == [], "exported by lifecycle, but not used by the docs' code: lifecycle.lowlevel"
    assert sorted(derived - exported) == [], "used by the docs' code (or its types), but not exported by lifecycle"


def test_the_top_level_and_lowlevel_share_no_name() -> None:
    """A name has one public path: ``lifecycle`` and ``lifecycle.lowlevel`` export disjoint names."""
    assert set(lifecycle.__all__) & set(lifecycle.lowlevel.__all__) == set()


def test_the_derivation_reads_imports_attributes_calls_and_bases() -> None:
    """The reader finds ``from lifecycle import`` (aliased too), ``lifecycle.NAME``, calls, bases; no sub-package."""
    code = (
        "import lifecycle\n"
        "from lifecycle import Callback as Base, PretrainConfig, restart\n"
        "class Mine(Base): ...\n"
        "config = PretrainConfig(liveness=lifecycle.LivenessConfig())\n"
        "lifecycle.exit_code(None)\n"
    )
    use = docs_use([code])
    assert use.used == {"Callback", "PretrainConfig", "LivenessConfig", "exit_code"}
    assert use.constructed == {"PretrainConfig", "LivenessConfig", "exit_code"}
    assert use.subclassed == {"Callback"}


def test_the_docs_code_is_found() -> None:
    """The blocks read are the documents' Python code: the README's ``train.py``, the how-to's own loop among them."""
    labels = [block.label for block in docs_code()]
    assert any(label.startswith("README.md:") and "train.py" in label for label in labels), labels
    assert any(label.startswith("docs/howto.md:") and "own_loop.py" in label for label in labels), labels
