"""Refuse, before any child starts, a script that would start the run again in every child.

Each child fastrl starts (forked from its fork server, fastrl.ipc.start) imports the user's
main module again (as ``__mp_main__``), as a spawned one does. A script that calls
:func:`fastrl.train` at its top level, outside
``if __name__ == "__main__":``, would call it again inside every child while that child is still
starting; multiprocessing refuses that in the child, the child dies, and the parent can be left
blocked writing the child's start-up arguments into a pipe nobody reads.
"""
from __future__ import annotations

import ast
import sys


def unguarded_main_call(depth_limit: int = 200) -> str | None:
    """``"script.py:LINE"`` of the call to us from the top level of the ``__main__`` module
    outside an ``if __name__ == "__main__":`` block; None when there is none or the source
    cannot be read (an interactive session has no file to re-run)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return None
    frame = sys._getframe(1)
    for _ in range(depth_limit):
        if frame is None:
            return None
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            break
        frame = frame.f_back
    else:
        return None
    if frame is None:
        return None
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    line = frame.f_lineno
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= node.end_lineno:
            return None
    return f"{path}:{line}"


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    constants = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(constants) == 1
