"""Building a Config: profiles, TOML files, ``--set`` overrides and a saved run's config.toml."""
from __future__ import annotations

import difflib
import typing
from dataclasses import MISSING
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
import tomli_w

from .rules import validate
from .schema import DEFAULT_PROFILE, KEYS, PBT_MEMBER_KEYS, SECTIONS, Config, ConfigError


def _unknown_key_error(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(KEYS), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ConfigError(f"unknown config key '{key}'{hint}; run `fastrl-train --list-keys` for all keys")


def _coerce(key: str, value, annotation):
    """Return ``value`` converted to ``annotation`` (from TOML or a --set string), or raise."""
    origin = typing.get_origin(annotation)
    from_string = isinstance(value, str) and annotation is not str
    try:
        if annotation is bool:
            if from_string:
                lowered = value.strip().lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return lowered in ("true", "1", "yes")
            if isinstance(value, bool):
                return value
            raise ValueError
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError
            if from_string:
                value = float(value.replace("_", "")) if "e" in value.lower() else int(value.replace("_", ""))
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                value = int(value)
            if not isinstance(value, int):
                raise ValueError
            return value
        if annotation is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value.replace("_", "")) if from_string else float(value)
        if annotation is str:
            if not isinstance(value, str):
                raise ValueError
            return value
        if origin is list:
            (item_type,) = typing.get_args(annotation)
            if from_string:
                value = _list_from_string(value)
            if not isinstance(value, (list, tuple)):
                raise ValueError
            return [_coerce(key, v.strip() if isinstance(v, str) else v, item_type) for v in value]
        if annotation is dict or origin is dict:
            if from_string:
                value = tomllib.loads(f"v = {value}")["v"]
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (ValueError, TypeError, tomllib.TOMLDecodeError):
        pass
    type_name = getattr(annotation, "__name__", str(annotation))
    raise ConfigError(f"config key '{key}' expects {type_name}, got {value!r}")


def _list_from_string(text: str) -> list:
    """A --set list: TOML (``["random", "my_bots:greedy"]``, as config.toml writes it), or bare
    comma-separated items (``[random,my_bots:greedy]``, ``[64,64]``)."""
    try:
        parsed = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = None
    return parsed if isinstance(parsed, list) else [v for v in text.strip("[] ").split(",") if v.strip()]


def set_user_value(cfg: Config, key: str, value) -> None:
    """Set a user's ``value`` (``--set`` text, or a TOML value) at ``section.key`` (or a top-level
    key) on ``cfg``, parsed to the key's declared type (ConfigError otherwise); ``pbt.start.KEY``
    sets KEY's start values per member (a list of KEY's type), ``pbt.start`` the whole table of them."""
    if key.startswith(PBT_START):
        _set_start_values(cfg, key[len(PBT_START):], value)
        return
    if key == PBT_START_TABLE:
        _set_start_table(cfg, value)
        return
    declared = KEYS.get(key)
    if declared is None:
        raise _unknown_key_error(key)
    set_typed_value(cfg, key, _coerce(key, value, declared.type))


def get_value(cfg: Config, key: str):
    """The value of ``section.key`` (or a top-level key) on ``cfg``, as stored."""
    section, _, name = key.rpartition(".")
    return getattr(getattr(cfg, section) if section else cfg, name)


def set_typed_value(cfg: Config, key: str, value) -> None:
    """Store ``value``, already of the key's type, at ``section.key`` as it is (set_user_value parses
    and checks what a user gives)."""
    section, _, name = key.rpartition(".")
    setattr(getattr(cfg, section) if section else cfg, name, value)


PBT_START_TABLE = "pbt.start"
PBT_START = PBT_START_TABLE + "."


def _set_start_table(cfg: Config, table) -> None:
    """``pbt.start`` replaced by ``table`` (a profile's [pbt.start] or --set 'pbt.start={...}'),
    each of its keys checked as ``pbt.start.KEY`` is."""
    cfg.pbt.start = {}
    for key, values in _coerce(PBT_START_TABLE, table, dict).items():
        _set_start_values(cfg, key, values)


def _set_start_values(cfg: Config, key: str, values) -> None:
    declared = KEYS.get(key)
    if key not in PBT_MEMBER_KEYS:
        raise ConfigError(f"pbt.start.{key}: members start apart only in keys their own learner reads: "
                          f"{', '.join(PBT_MEMBER_KEYS)}")
    if not isinstance(values, (list, tuple, str)):
        raise ConfigError(f"pbt.start.{key} takes one value per member ([v0, v1, ...]), got {values!r}")
    per_member = _coerce(f"pbt.start.{key}", values, list[declared.type])
    for value in per_member:
        declared.check(value, cfg.learner.algo)
    cfg.pbt.start = {**cfg.pbt.start, key: per_member}


def apply_dict(cfg: Config, data: dict, prefix: str = "") -> None:
    """Apply a nested dict (a parsed profile or config.toml) onto ``cfg``."""
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and not prefix and key in SECTIONS:
            apply_dict(cfg, value, prefix=f"{key}.")
        else:
            set_user_value(cfg, full, value)


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got '{text}' (example: --set learner.lr=1e-3)")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def available_profiles() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in resources.files("fastrl.profiles").iterdir()
                  if p.name.endswith(".toml"))


def load_profile(name: str) -> Config:
    """Load a named profile (profiles/NAME.toml) or a path to a TOML file."""
    path = Path(name)
    if path.suffix == ".toml" and path.exists():
        source = path
    else:
        source = resources.files("fastrl.profiles") / f"{name}.toml"
        if not source.is_file():
            close = difflib.get_close_matches(name, available_profiles(), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"unknown profile '{name}': {hint}available: {', '.join(available_profiles())}")
    return config_from_toml(source, f"profile '{name}'")


def config_from_toml(source, label: str, ignored: tuple[str, ...] = (), saved: bool = False) -> Config:
    """The config in ``source`` (a Path or a package resource), keys ``ignored`` (``expected``,
    ``expect.final_reports``) left out; with ``saved`` (a run's own config.toml) a key it lacks
    has its ``Key.default_when_saved``.
    ConfigError naming ``label`` (and, for a TOML error, the line) for a file that is not TOML in
    UTF-8 or holds a key or value that no config takes."""
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label} is not valid TOML: {exc}; correct it") from None
    for key in ignored:
        *tables, name = key.split(".")
        table = data
        for part in tables:
            table = table.get(part) if isinstance(table, dict) else None
        if isinstance(table, dict):
            table.pop(name, None)
    cfg = Config()
    try:
        apply_dict(cfg, data)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if saved:
        present = flat_config(data)
        for name, declared in KEYS.items():
            if name not in present and declared.saved_default is not MISSING:
                set_user_value(cfg, name, declared.saved_default)
    return cfg


def build_config(profile: str = DEFAULT_PROFILE, overrides: dict | None = None) -> Config:
    """A profile with ``overrides`` ({"learner.lr": 1e-3, ...}) applied, validated."""
    cfg = load_profile(profile)
    for key, value in (overrides or {}).items():
        set_user_value(cfg, key, value)
    validate(cfg)
    return cfg


def to_toml(cfg: Config) -> str:
    """The full resolved config as TOML: top-level keys first, then one table per section.
    tomli_w quotes keys and escapes strings, so any env.kwargs made of TOML values round-trips."""
    try:
        return tomli_w.dumps(cfg.to_dict())
    except TypeError as exc:  # only env.kwargs can hold values TOML has no type for (None, objects)
        raise ConfigError(f"config.toml cannot hold env.kwargs {cfg.env.kwargs!r}: {exc}; use strings, "
                          f"numbers, booleans, lists and tables") from None


def flat_config(config: dict) -> dict:
    """{"learner": {"lr": 0.001}} -> {"learner.lr": 0.001}; tables inside a section (env.kwargs)
    stay one value, as they are one setting."""
    flat = {}
    for key, value in config.items():
        if key in SECTIONS:
            flat.update({f"{key}.{name}": setting for name, setting in value.items()})
        else:
            flat[key] = value
    return flat


def load_run_config(run_dir: Path) -> Config:
    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise ConfigError(f"no config.toml in '{run_dir}': pass the run directory that fastrl-train wrote")
    # Older run directories hold the promise as a line of text, `expected`, or judge it on the
    # last N reports, `expect.final_reports` (now expect.final_stretch): promises never changed a
    # run, so they are not carried over.
    return config_from_toml(path, f"'{path}'", ignored=("expected", "expect.final_reports"), saved=True)
