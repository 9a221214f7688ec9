"""The fastrl-profile command (argument parsing lives in fastrl.cli.profile_main)."""
from __future__ import annotations

from pathlib import Path

from ..config import build_config, parse_override
from .diagnosis import ProfileError
from .measure import DEFAULT_SECONDS, profile
from .plot import plot_profile, pyplot
from .report import format_autotune, format_report, write_json
from .sampling import hardware
from .tuning import DEFAULT_BUDGET_S, DEFAULT_TRIAL_SECONDS, autotune


def command(profile_name: str, env: str | None, overrides: list[str], seconds: float | None,
            warmup_seconds: float | None, json_path: str | None, plot_path: str | None, autotune_run: bool,
            budget_seconds: float | None) -> str:
    """Run fastrl-profile; returns the text to print. Raises ConfigError, ProfileError or PlotError (one line)."""
    pairs = dict(parse_override(text) for text in overrides)
    if env:
        pairs["env.id"] = env
    cfg = build_config(profile_name, pairs)
    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        if path and not Path(path).resolve().parent.is_dir():
            raise ProfileError(f"{flag} {path}: the directory does not exist")
    if plot_path and autotune_run:
        raise ProfileError("--plot draws a profile; run it without --autotune")
    if budget_seconds is not None and not autotune_run:
        raise ProfileError("--budget-seconds limits --autotune; add --autotune")
    if plot_path:
        pyplot("--plot")  # fail now, not after the measurements
    if autotune_run:
        result = autotune(cfg, budget_seconds or DEFAULT_BUDGET_S, seconds or DEFAULT_TRIAL_SECONDS, warmup_seconds)
        result.profile, result.overrides, result.hardware = profile_name, pairs, hardware()
        text = format_autotune(result)
    else:
        result = profile(cfg, seconds or DEFAULT_SECONDS, warmup_seconds, profile_name, pairs)
        text = format_report(result)
        if plot_path:
            plot_profile(result, plot_path)
    if json_path:
        write_json(result, json_path)
    return text
