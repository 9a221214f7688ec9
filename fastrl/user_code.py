"""The user's code that a config or a command names: ``env.id`` (``MODULE:CALLABLE`` and
``pettingzoo:MODULE``), ``policies.mapping``, ``eval.opponents`` and ``--opponent``.

Importing a module runs it, so whatever goes wrong there is the user's to fix: a missing module, a
syntax error, an exception at import, a relative name. Each is one line naming the option, the
module and the error's first line, raised as the caller's error class (a ValueError, which every
command reports in one line)."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType


def first_line(exc: BaseException) -> str:
    """``exc`` as "Type: its message's first line", for a one-line error."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def import_user_module(module_name: str, option: str, spec: str, error: type[ValueError] = ValueError,
                       not_found: str = "correct the module name or put its directory on PYTHONPATH") -> ModuleType:
    """The module ``module_name`` that ``spec`` (given by ``option``) names, imported; ``error``
    (one line) when it cannot be, saying ``not_found`` when there is no such module."""
    if not module_name or module_name.startswith("."):
        raise error(f"{option} {spec!r}: {module_name!r} is not an absolute module name; name the module in full "
                    f"(package.module), from a directory on PYTHONPATH")
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise error(f"{option} {spec!r}: cannot import {module_name!r} ({first_line(exc)}); {not_found}") from None
        raise error(f"{option} {spec!r}: importing {module_name!r} failed ({first_line(exc)}); install what it "
                    f"imports") from None
    except Exception as exc:  # the user's module: its failure is theirs to fix, said in one line
        raise error(f"{option} {spec!r}: importing {module_name!r} failed ({first_line(exc)}); fix the module so "
                    f"that it imports") from None


def load_callable(spec: str, option: str, wanted: str, error: type[ValueError] = ValueError) -> Callable:
    """What ``spec`` ("MODULE:CALLABLE", given by ``option``) names, imported; ``error`` (one line,
    saying that ``wanted`` is expected) when it is malformed, cannot be imported, or is missing or
    not callable."""
    module_name, _, name = spec.partition(":")
    if not name.isidentifier():
        raise error(f"{option} {spec!r} is not MODULE:CALLABLE; give {wanted}")
    module = import_user_module(module_name, option, spec, error)
    found = getattr(module, name, None)
    if found is None:
        raise error(f"{option} {spec!r}: module {module_name!r} has no {name!r}; name a callable in it, {wanted}")
    if not callable(found):
        raise error(f"{option} {spec!r} is not callable (type {type(found).__name__}); give {wanted}")
    return found
