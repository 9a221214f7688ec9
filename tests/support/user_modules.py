"""The user's modules that cannot be imported, written for a test into a folder put on sys.path:
one that raises at import, one with a syntax error, one whose import of a dependency fails, and a
relative module name. BROKEN maps each to the module name a spec gives and the part of the one-line
error that names it; use it as ``f"{module}:fn"``."""
from __future__ import annotations

from pathlib import Path

import pytest

SOURCES = {
    "fastrl_test_raises": "raise RuntimeError('boom at import\\nsecond line of the error')\n",
    "fastrl_test_syntax": "def fn(observation, agent):\n    return (\n",
    "fastrl_test_needs": "import no_such_dependency_x\n\n\ndef fn(observation, agent):\n    return 0\n",
}
BROKEN = [
    ("fastrl_test_raises", "importing 'fastrl_test_raises' failed (RuntimeError: boom at import); fix the module"),
    ("fastrl_test_syntax", "importing 'fastrl_test_syntax' failed (SyntaxError: "),
    ("fastrl_test_needs", "importing 'fastrl_test_needs' failed (ModuleNotFoundError: No module named "
                          "'no_such_dependency_x'); install what it imports"),
    (".fastrl_test_relative", "'.fastrl_test_relative' is not an absolute module name"),
]


def install(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write SOURCES into ``folder`` and put it on sys.path for this test."""
    for name, source in SOURCES.items():
        (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
