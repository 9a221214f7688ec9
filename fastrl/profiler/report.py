"""Text output: the profile and the autotune search as tables, and either as JSON."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .diagnosis import share_keys
from .measure import ProfileResult
from .tuning import AutotuneResult, set_args

RUNS = ("env", "sample", "train")  # raw env, sampling, training: the keys of per-run figures


def format_report(result: ProfileResult) -> str:
    """The profile as a table: throughput against the raw limit, breakdown, processes, diagnosis."""
    cfg, hw = result.config, result.hardware
    env = cfg["env"]
    lines = [
        f"fastrl-profile  {result.profile or ''}  {result.env_id}  {env['num_workers']} workers x "
        f"{env['envs_per_worker']} envs in {env['num_splits']} splits  device {cfg['device']}",
        f"{hw['cpu_count']} cores ({hw['cpu_model']}){'  GPU ' + ', '.join(hw['gpus']) if hw['gpus'] else ''}  "
        f"each run measured for ~{result.seconds:g} s after start-up + {result.warmup_seconds:g} s warm-up",
        "",
        f"{'':24}{'env steps/s':>14}{'frames/s':>14}{'vs raw env':>12}{'measured s':>12}{'start-up s':>12}",
    ]
    throughput = (("raw env (random acts)", "env", result.env_fps, result.env_frames_per_s, 1.0),
                  ("sampling", "sample", result.sample_fps, result.sample_frames_per_s, result.sample_ratio),
                  ("training", "train", result.train_fps, result.train_frames_per_s, result.train_ratio))
    for label, run, fps, frames, ratio in throughput:
        startup = f"{result.startup_s[run]:>12.1f}" if run in result.startup_s else f"{'-':>12}"
        lines.append(f"{label:24}{fps:>14,.0f}{frames:>14,.0f}{ratio:>12.2f}{result.window_s[run]:>12.1f}{startup}")
    sample, train = result.breakdown["sample"], result.breakdown["train"]
    # With inference.in_workers no batcher runs: its rows would be zeros, and the workers' acting
    # time is rollout/inference.
    batcher = not result.acting_in_workers
    lines += ["", f"{'breakdown (share of wall time; rollout per worker)':52}{'sampling':>10}{'training':>10}"]
    for key in share_keys(sample):
        if batcher or not key.startswith("inference/"):
            lines.append(f"  {key:50}{100 * sample[key]:>9.1f}%{100 * train[key]:>9.1f}%")
    rates = ("inference/requests_per_batch", "inference/batches_per_s") if batcher else ()
    for key in (*rates, "learner/updates_per_s"):
        lines.append(f"  {key:50}{sample[key]:>10.1f}{train[key]:>10.1f}")
    if not batcher:
        lines.append("  no batcher process: the workers act for themselves (inference.in_workers)")
    lag = result.policy_lag
    lines.append(f"  {'policy lag mean / min / max (training)':50}{'':>10}{lag['mean']:>4.1f} / {lag['min']:.0f} / "
                 f"{lag['max']:.0f}")
    lines += ["", f"{'processes (cpu % of a core, peak rss MiB)':44}{'raw env':>18}{'sampling':>18}{'training':>18}"]
    names = list(dict.fromkeys(p["name"] for run in RUNS for p in result.processes[run]))
    for name in names:
        cells = []
        for run in RUNS:
            row = next((p for p in result.processes[run] if p["name"] == name), None)
            cells.append(f"{row['cpu_percent'] or 0:>8.0f}% {row['rss_mib']:>7.0f}" if row else f"{'-':>18}")
        lines.append(f"  {name:42}" + "".join(f"{c:>18}" for c in cells))
    used = result.cores_used
    lines.append(f"  {'cores used':42}{used['env']:>18.2f}{used['sample']:>18.2f}{used['train']:>18.2f}")
    for run, gpus in (result.gpus or {}).items():
        for gpu in gpus:
            util = "n/a" if gpu["util_percent"] is None else f"{gpu['util_percent']:.0f}%"
            lines.append(f"  GPU {gpu['index']} {gpu['name']} ({run}): util {util}, memory "
                         f"{gpu['memory_used_mib']:.0f} / {gpu['memory_total_mib']:.0f} MiB")
    lines += ["", f"diagnosis (sampling): {result.sample_diagnosis}", f"diagnosis: {result.diagnosis}"]
    return "\n".join(lines)


def format_autotune(result: AutotuneResult) -> str:
    lines = [f"autotune: {sum(t.status == 'ok' for t in result.trials)} trials of {result.trial_seconds:g} s "
             f"in {result.elapsed_s:.0f} s (budget {result.budget_seconds:g} s)"
             + ("" if result.complete else "; stopped: the budget could not fit another trial"), ""]
    lines.append(f"  {'#':>3}  {'train steps/s':>14}  {'status':8}  settings changed")
    for i, t in enumerate(result.trials, 1):
        fps = f"{t.train_fps:,.0f}" if t.status == "ok" else "-"
        note = "" if t.status == "ok" else f"  ({t.error})"
        lines.append(f"  {i:>3}  {fps:>14}  {t.status:8}  {set_args(t.changed) or '(profile as given)'}{note}")
    gain = f" ({result.gain:.2f}x the profile as given)" if result.gain else ""
    lines += ["", f"best: {result.best_fps:,.0f} env steps/s{gain}", f"  {result.set_args}", "",
              "as a profile (TOML):", result.toml]
    return "\n".join(lines)


def _json_ready(value):
    """JSON has no NaN or infinity: write them as null, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def write_json(result: ProfileResult | AutotuneResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(_json_ready(result.to_dict()), indent=2) + "\n")
