"""The options the benchmarks share, each declared once: ``--set`` overrides, ``--rounds``, and
the setups. A setup is a profile with the overrides a benchmark measures it in, in
scripts/benchmarks/setups/NAME.toml.

A setup file names its ``profile`` and holds its overrides as a profile holds values: top-level
keys, and one table per section (``[env]``, ``[learner]``, ...).

fastrl is imported inside the functions that need it: the batcher benchmark declares its options
here and runs again against an older checkout's fastrl, which it imports only to measure.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

SETUPS = Path(__file__).resolve().parent / "setups"


def add_set(p, help: str = "override for every run (e.g. device=cpu)", required: bool = False) -> None:
    p.add_argument("--set", action="append", default=[], required=required, metavar="KEY=VALUE", help=help)


def add_rounds(p, default: int, help: str) -> None:
    p.add_argument("--rounds", type=int, default=default, help=f"{help} (default {default})")


def add_setup(p, help: str) -> None:
    p.add_argument("--setup", metavar="NAME", help=f"{help}: a file of scripts/benchmarks/setups/ "
                                                  f"({', '.join(setup_names())}) or a path to one")


def overrides(texts: list[str]) -> dict:
    """``--set`` texts ("learner.lr=1e-3") as a dict of overrides; ConfigError for one without '='."""
    from fastrl.config import parse_override
    return dict(parse_override(text) for text in texts)


@dataclass(frozen=True)
class Setup:
    profile: str
    overrides: dict  # {"env.num_workers": 2, ...}, as build_config takes them


def setup_names() -> list[str]:
    return sorted(path.stem for path in SETUPS.glob("*.toml"))


def load_setup(name: str) -> Setup:
    """scripts/benchmarks/setups/NAME.toml, or the TOML file at the path ``name``; ConfigError (one
    line) for a setup that is not there, is not TOML or names no profile."""
    from fastrl.config import ConfigError
    path = Path(name) if name.endswith(".toml") else SETUPS / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown setup '{name}': available: {', '.join(setup_names())}, or a path to a TOML file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"setup {path} is not valid TOML: {exc}; correct it") from None
    profile = data.pop("profile", None)
    if not isinstance(profile, str):
        raise ConfigError(f"setup {path} names no profile: add profile = \"NAME\" at its top")
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{name}": setting for name, setting in value.items()})
        else:
            flat[key] = value
    return Setup(profile, flat)
