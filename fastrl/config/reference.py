"""The config keys as text, from their one declaration in fastrl.config.schema: the lines
``fastrl-train --list-keys`` prints, and docs/config.md (``python -m fastrl.config.reference > docs/config.md``;
tests/unit/config/test_config.py checks that the file is current)."""
from __future__ import annotations

import inspect
import json
import sys
import typing

from .schema import ALGOS, KEYS, SECTIONS, Choices, Config, Key


def type_name(declared: Key) -> str:
    """``int``, ``float``, ``bool``, ``str``, ``list[int]``, ``dict``: as --set parses the value."""
    return str(declared.type) if typing.get_origin(declared.type) else declared.type.__name__


def default_text(declared: Key) -> str:
    """The default as TOML writes it (``true``, ``"auto"``, ``[64, 64]``, ``{}``)."""
    return json.dumps(declared.default)


def allowed_text(declared: Key) -> str:
    """The values the key allows, and what is allowed instead where its algorithm does not read it."""
    allowed = declared.allowed
    if allowed is None:
        text = "true, false" if declared.type is bool else "any"
    elif isinstance(allowed, Choices):
        text = ", ".join(json.dumps(name) for name in allowed.names)
    else:
        text = str(allowed)
    if declared.unread is not None:
        others = [algo for algo in ALGOS if algo not in declared.algos]
        text += f"; {', '.join(others)}: {declared.unread}"
    return text


def readers_text(declared: Key) -> str:
    return "all" if set(declared.algos) == set(ALGOS) else ", ".join(declared.algos)


def list_keys() -> str:
    """One line per key: ``key = default  # type; allowed; read by; help``."""
    width = max(len(name) + len(default_text(k)) for name, k in KEYS.items()) + 3
    lines = []
    for name, declared in KEYS.items():
        setting = f"{name} = {default_text(declared)}"
        lines.append(f"{setting:<{width}}  # {type_name(declared)}; {allowed_text(declared)}; "
                     f"read by {readers_text(declared)}. {declared.help}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(prefix: str, heading: str, intro: str) -> list[str]:
    lines = [f"## {heading}", "", intro, "", "| key | type | default | allowed values | read by | help |",
             "|---|---|---|---|---|---|"]
    for name, declared in KEYS.items():
        if name.rpartition(".")[0] == prefix:
            cells = [f"`{name}`", f"`{type_name(declared)}`", f"`{default_text(declared)}`", allowed_text(declared),
                     readers_text(declared), declared.help]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


def markdown() -> str:
    """docs/config.md: one table per section (key, type, default, allowed values, read by, help)."""
    lines = ["# Config keys", "",
             "Generated from `fastrl/config/schema.py` by `python -m fastrl.config.reference > docs/config.md`; "
             "`tests/unit/config/test_config.py` checks that it is current. Set a key in a profile's table or with "
             "`--set section.key=value`; `fastrl-train --list-keys` prints the same, one line per key. "
             "\"read by\" names the algorithms (`learner.algo`) that use the key. The others ignore it or refuse "
             "a value that would have no effect; where its allowed values say so, they accept any finite value.",
             ""]
    lines += _table("", "Top-level keys", inspect.getdoc(Config))
    for section, cls in SECTIONS.items():
        lines += _table(section, f"[{section}]", inspect.getdoc(cls).replace("\n", " "))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
