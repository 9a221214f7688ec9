"""Command-line entry points: fastrl-train, fastrl-eval, fastrl-export, fastrl-profile, fastrl-sweep and
fastrl-plot.

Heavy imports (torch, envs) happen inside the commands: a command that needs none (fastrl-plot,
--help, a refused config) answers without them.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .config import DEFAULT_PROFILE, ConfigError, available_profiles
from .ipc.fast_exit import skip_final_collection
from .reporting.console import write_best_effort
from .reporting.metrics import finite_or_null


def _fail(prog: str, exc: Exception) -> int:
    write_best_effort(sys.stderr, f"{prog}: error: {exc}")
    return 2


class _Terminated(BaseException):
    """SIGTERM, raised where the command is: a BaseException, as KeyboardInterrupt, so that no
    ``except Exception`` takes it for an error, and every ``finally`` on the way out runs (an
    unfinished video is removed)."""


def _raise_terminated(signum, frame):
    raise _Terminated


def _user_errors():
    from .files.checkpoint import CheckpointError
    from .learner import NonFiniteTraining
    from .run.training import RunError

    return (ConfigError, CheckpointError, RunError, NonFiniteTraining, ValueError, FileNotFoundError)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """--profile, --env and --set: how every command picks its config."""
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"profile name or a .toml path (default {DEFAULT_PROFILE}; available: "
                        f"{', '.join(available_profiles())})")
    p.add_argument("--env", help="env id (envpool task, gymnasium id, or module:callable factory)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key, e.g. --set learner.lr=1e-3 (repeatable)")


def add_best_argument(p: argparse.ArgumentParser) -> None:
    """--best: the commands that load a run's policy (fastrl-eval, fastrl-export)."""
    p.add_argument("--best", action="store_true",
                   help="the best weights evaluated during training (checkpoints/best.pt; training with "
                        "--set eval.every_s=60 writes it) instead of the latest checkpoint")


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastrl-train", description="Train an agent with fastrl.")
    add_config_arguments(p)
    p.add_argument("--run-dir", help="output directory (default: a new runs/<profile>-<date>-<time>); one that "
                                     "already holds a run needs --resume or --overwrite")
    p.add_argument("--train-for-env-steps", type=int,
                   help="stop when the run has this many env steps, counted from its start: a resumed run counts "
                        "the steps it did before the resume")
    p.add_argument("--train-for-seconds", type=float,
                   help="stop after this many seconds of training, counted from when the run's processes start "
                        "(the env probe and spawning are not counted): a resumed run counts the time it trained "
                        "before the resume")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --run-dir (every file fastrl wrote there is deleted: config, metrics, "
                        "logs, checkpoints, league/, pbt/, videos)")
    p.add_argument("--seed", type=int)
    p.add_argument("--serial", action="store_true", help="run everything in one process (debugging)")
    p.add_argument("--quiet", action="store_true", help="no status line")
    p.add_argument("--list-keys", action="store_true",
                   help="print every config key (default, allowed values, the algorithms that read it, help) and "
                        "exit")
    return p


def resolve_train_config(args):
    from .config import Config, build_config, load_run_config, parse_override, set_user_value, validate

    if args.resume:
        if not args.run_dir:
            raise ConfigError("--resume needs --run-dir DIR (the directory of the run to continue)")
        if not Path(args.run_dir).is_dir():
            raise ConfigError(f"run directory '{args.run_dir}' does not exist; check the path")
        cfg: Config = load_run_config(Path(args.run_dir))
    else:
        cfg = build_config(args.profile)
    for text in args.overrides:
        set_user_value(cfg, *parse_override(text))
    for key, value in (("env.id", args.env), ("train_for_env_steps", args.train_for_env_steps),
                       ("train_for_seconds", args.train_for_seconds), ("seed", args.seed)):
        if value is not None:
            set_user_value(cfg, key, value)
    if args.train_for_seconds is not None and args.train_for_env_steps is None:
        cfg.train_for_env_steps = 0  # a time budget alone: don't also stop at the profile's step count
    if args.serial:
        cfg.serial = True
    validate(cfg)
    return cfg


def _stop_fork_server(started_here: bool) -> None:
    """Stop the fork server train_main started for a run that is not going to happen."""
    if started_here:
        from .ipc.start import stop_fork_server
        stop_fork_server()


def train_main(argv=None) -> int:
    skip_final_collection()
    args = train_parser().parse_args(argv)
    if args.list_keys:
        from .config.reference import list_keys

        write_best_effort(sys.stdout, list_keys())
        return 0
    made_dir, started_server = None, False
    try:
        from .files.run_dir import RunDirError, default_run_dir, first_missing, remove_unused_run_dir

        cfg = resolve_train_config(args)
        if not cfg.serial:
            # The fork server's imports (torch, numba, envpool: ~3 s) overlap this process's own
            # import of torch below instead of following it: a short run ends 1.4-2.3 s sooner alone on 2 cores.
            from .ipc.start import child_context, fork_server_pid
            running = fork_server_pid()
            child_context()
            started_server = fork_server_pid() != running
        from .run.training import train

        if args.run_dir:
            run_dir = Path(args.run_dir)  # train() removes what it makes of it on a refusal
        else:
            runs_root = Path("runs")
            made_from = first_missing(runs_root)
            run_dir = made_dir = default_run_dir(args.profile, runs_root)
        result = train(cfg, run_dir=run_dir, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite)
    except KeyboardInterrupt:
        _stop_fork_server(started_server)
        raise
    except (*_user_errors(), RunDirError) as exc:
        if made_dir is not None:
            remove_unused_run_dir(made_dir, made_from)
        _stop_fork_server(started_server)
        return _fail("fastrl-train", exc)
    final = result.final
    summary = {"run_dir": str(run_dir), "env_steps": final.get("env_steps"),
               "episode_return_mean": final.get("episode_return_mean"), "wall_time": final.get("wall_time")}
    write_best_effort(sys.stdout, json.dumps(finite_or_null(summary)))
    return 0


def eval_main(argv=None) -> int:
    skip_final_collection()
    p = argparse.ArgumentParser(prog="fastrl-eval",
                                description="Evaluate the latest (or the best) checkpoint of a run, alone or "
                                            "against an opponent; optionally write a video of the episodes.")
    p.add_argument("run_dir")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--deterministic", action="store_true", help="argmax / mean actions instead of sampling")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=12345)
    add_best_argument(p)
    p.add_argument("--video", metavar="PATH.mp4",
                   help="play the episodes one at a time on a rendered env and write them as an H.264 MP4 "
                        "(needs pip install 'fastrl[video]')")
    p.add_argument("--fps", type=int, help="frames per second of the video: one frame per env step (default 30)")
    p.add_argument("--opponent", metavar="NAME|MODULE:CALLABLE",
                   help="in a multi-agent env, play the policy in one seat and this opponent in every other, the "
                        "policy's seat rotating so each seat gets an equal share of --episodes; prints win_rate, "
                        "draw_rate and loss_rate overall and per seat: the sign of the policy's seat's episode "
                        "return (> 0 a win, 0 a draw, < 0 a loss, as in zero-sum classic games). Built in: random "
                        "(uniform over the legal actions), connect_four_one_ply (wins now, else blocks, else random), "
                        "tictactoe_minimax (a perfect tic-tac-toe player); "
                        "MODULE:CALLABLE is fn(observation, agent) -> action, given the agent's observation as the "
                        "env returns it (with action_mask in classic games) and its name")
    p.add_argument("--policy", metavar="NAME",
                   help="which of the run's policies plays (policies.names, or the agents' names with "
                        "policies.mapping=per_agent); default: the first")
    args = p.parse_args(argv)
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        from .evaluation.episodes import evaluate_run, evaluation_device
        from .evaluation.video import VideoError, write_run_video

        if args.episodes <= 0:
            raise ConfigError(f"--episodes must be > 0, got {args.episodes}")
        if args.fps is not None and args.fps <= 0:
            raise ConfigError(f"--fps must be > 0, got {args.fps}")
        if args.video is not None and not args.video.strip():
            raise ConfigError("--video needs a file path ending in .mp4, got an empty one")
        device = evaluation_device(args.device)
        if args.video is not None:
            result = write_run_video(Path(args.run_dir), args.video, args.episodes, args.deterministic, device,
                                     args.seed, args.best, args.fps, args.opponent, args.policy)
        else:
            result = evaluate_run(Path(args.run_dir), args.episodes, args.deterministic, device, args.seed,
                                  args.best, args.opponent, args.policy)
    except (*_user_errors(), VideoError) as exc:
        return _fail("fastrl-eval", exc)
    except KeyboardInterrupt:
        write_best_effort(sys.stderr, "fastrl-eval: interrupted; no result (run it again for one)")
        return 130
    except _Terminated:
        write_best_effort(sys.stderr, "fastrl-eval: stopped by SIGTERM; no result")
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    write_best_effort(sys.stdout, json.dumps(result))
    return 0


def export_main(argv=None) -> int:
    skip_final_collection()
    from .evaluation.export import FORMATS

    p = argparse.ArgumentParser(
        prog="fastrl-export",
        description="Write a run's policy as one self-contained file (TorchScript or ONNX) that maps the env's "
                    "observation to the env's action, loadable without fastrl (docs/evaluation.md); prints what "
                    "it wrote as one JSON line: the file's inputs and outputs and the checkpoint it holds.")
    p.add_argument("run_dir")
    p.add_argument("--format", dest="fmt", choices=FORMATS, required=True,
                   help="torchscript (torch.jit.load) or onnx (onnxruntime; needs pip install 'fastrl[export]')")
    p.add_argument("--out", required=True, metavar="PATH", help="the file to write")
    add_best_argument(p)
    p.add_argument("--stochastic", action="store_true",
                   help="sample actions (as training does) instead of the argmax / mean actions of fastrl-eval "
                        "--deterministic")
    args = p.parse_args(argv)
    try:
        from .evaluation.export import export_run

        result = export_run(Path(args.run_dir), args.fmt, Path(args.out), args.best, args.stochastic)
    except _user_errors() as exc:
        return _fail("fastrl-export", exc)
    write_best_effort(sys.stdout, json.dumps(result))
    return 0


def profile_main(argv=None) -> int:
    skip_final_collection()
    p = argparse.ArgumentParser(
        prog="fastrl-profile",
        description="Measure raw env, sampling and training throughput on the same cores, with a per-component "
                    "breakdown and a one-line bottleneck diagnosis; or --autotune the throughput knobs.")
    add_config_arguments(p)
    p.add_argument("--seconds", type=float,
                   help="steady-state seconds measured per run (default 10; with --autotune, per trial: default "
                        "4); each run also spends its start-up and the warm-up")
    p.add_argument("--warmup-seconds", type=float,
                   help="skipped once a run flows, before measuring (default --seconds / 8, within 1-3 s)")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="write every figure as JSON")
    p.add_argument("--plot", dest="plot_path", metavar="OUT.png",
                   help="write a PNG of throughput and breakdown (needs matplotlib: pip install 'fastrl[plot]')")
    p.add_argument("--autotune", action="store_true",
                   help="search env.num_workers, envs_per_worker, num_splits, num_threads, thread_affinity, "
                        "learner.batch_size and inference.in_workers for the best training throughput")
    p.add_argument("--budget-seconds", type=float, help="wall-time budget of --autotune (default 300)")
    args = p.parse_args(argv)
    try:
        from .profiler import command

        text = command(args.profile, args.env, args.overrides, args.seconds, args.warmup_seconds, args.json_path,
                       args.plot_path, args.autotune, args.budget_seconds)
    except _user_errors() as exc:
        return _fail("fastrl-profile", exc)
    write_best_effort(sys.stdout, text)
    return 0


def sweep_parser() -> argparse.ArgumentParser:
    from .tuning.sweep import FAILURES_IN_A_ROW, PRUNE_RUNGS, STORAGE_FILE

    p = argparse.ArgumentParser(
        prog="fastrl-sweep",
        description="Search hyperparameters with Optuna (TPE sampler): each trial is a whole fastrl-train run in its "
                    "own run directory under SWEEP_DIR/NAME/, its objective reported as it trains so that a median "
                    "pruner stops trials clearly behind. Killed (even with SIGKILL) and run again with the same "
                    "command, the study goes on: finished trials are kept, the trials cut off run again with the "
                    "same params, and it ends at exactly --trials finished (complete or pruned) trials. At the end: "
                    "a table of the trials and the best configuration as SWEEP_DIR/NAME/best.toml, a profile "
                    "for fastrl-train --profile. Needs pip install 'fastrl[sweep]'.")
    add_config_arguments(p)
    p.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=DIST:ARGS", required=True,
                   help="a config key to search (repeatable): uniform:LOW:HIGH[:STEP] or loguniform:LOW:HIGH for a "
                        "float key; int:LOW:HIGH[:STEP] or intlog:LOW:HIGH for an integer key (both ends included); "
                        "choice:A,B,... for any key, each value as --set writes it (e.g. "
                        "learner.lr=loguniform:1e-5:1e-2, learner.entropy_coef=uniform:0:0.05, "
                        "learner.batch_size=choice:1024,2048,4096, model.hidden_sizes=choice:[64,64],[128,128])")
    p.add_argument("--trials", type=int, required=True, metavar="N",
                   help="finished (complete or pruned) trials the study ends with")
    p.add_argument("--budget-env-steps", type=int, default=0, metavar="N", help="each trial trains this many env steps")
    p.add_argument("--budget-seconds", type=float, default=0.0, metavar="S",
                   help="or each trial trains this many seconds (trained_seconds: start-up not counted); trials are "
                        "then compared at equal training time")
    p.add_argument("--objective", default="episode_return_mean", metavar="KEY",
                   help="the metrics.jsonl key scored (default episode_return_mean; eval_return_mean with --set "
                        "eval.every_s=...): a trial's value is its mean over the last tenth of the budget")
    p.add_argument("--direction", choices=("maximize", "minimize"), default="maximize",
                   help="maximize (default) or minimize the objective")
    p.add_argument("--study", default="sweep", metavar="NAME",
                   help="the study's name (default sweep): its trials live in SWEEP_DIR/NAME/")
    p.add_argument("--sweep-dir", required=True, metavar="DIR",
                   help="the sweep's directory; run the same command on it to continue")
    p.add_argument("--storage", metavar="URL",
                   help=f"Optuna storage, an SQLAlchemy URL (default sqlite:///SWEEP_DIR/{STORAGE_FILE}, which "
                        f"optuna-dashboard reads); a database several machines share runs one study on all of them")
    p.add_argument("--jobs", type=int, default=1, metavar="K",
                   help="trials run at once (default 1). Each trial is a whole fastrl run with its own rollout "
                        "workers, batcher and learner, so K jobs share the cores K ways: each trial trains about "
                        "K times slower, and with --budget-seconds gets fewer env steps; size env.num_workers "
                        "with --set so that K runs fit the cores")
    p.add_argument("--pruner", choices=("median", "none"), default="median",
                   help=f"median (default): Optuna's MedianPruner, checked at {PRUNE_RUNGS} points evenly over the "
                        f"budget; stops a trial whose best value so far is behind the median of the completed "
                        f"trials' at the same point. none: every trial runs its budget")
    p.add_argument("--prune-warmup", type=float, default=0.25, metavar="FRACTION",
                   help="no trial is pruned in this first fraction of its budget (default 0.25)")
    p.add_argument("--prune-after-trials", type=int, default=3, metavar="N",
                   help="no trial is pruned before N trials completed (default 3)")
    p.add_argument("--seed", type=int, metavar="SEED",
                   help="seeds the sampler (each trial's run keeps the config's seed)")
    p.epilog = (f"A trial whose run fails is marked failed and another is drawn; {FAILURES_IN_A_ROW} in a row "
                f"stop the sweep.")
    return p


def sweep_main(argv=None) -> int:
    skip_final_collection()
    args = sweep_parser().parse_args(argv)
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        from .tuning.search_space import parse_param
        from .tuning.sweep import SweepSpec, run_sweep

        spec = SweepSpec(profile=args.profile, env=args.env, overrides=args.overrides,
                         params=[parse_param(text) for text in args.params], objective=args.objective,
                         direction=args.direction, trials=args.trials, budget_env_steps=args.budget_env_steps,
                         budget_seconds=args.budget_seconds, study=args.study, sweep_dir=Path(args.sweep_dir),
                         storage=args.storage, jobs=args.jobs, pruner=args.pruner, prune_warmup=args.prune_warmup,
                         prune_after_trials=args.prune_after_trials, seed=args.seed)
        result = run_sweep(spec)
    except (ConfigError, OSError) as exc:
        return _fail("fastrl-sweep", exc)
    except (KeyboardInterrupt, _Terminated) as exc:
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else "stopped by SIGTERM"
        write_best_effort(sys.stderr, f"fastrl-sweep: {why}; the trials it was running will run again: run the "
                                      f"same command to continue")
        return 130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    write_best_effort(sys.stdout, "\n".join([result.table, result.summary]))
    return 0


def plot_main(argv=None) -> int:
    skip_final_collection()
    from .reporting.curves import X_AXES, plot_learning_curves

    p = argparse.ArgumentParser(
        prog="fastrl-plot",
        description="Draw learning curves from run directories: runs whose configs differ only in the seed are "
                    "drawn as one mean line with a min-max band (needs matplotlib: pip install 'fastrl[plot]').")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--x", dest="x_key", choices=list(X_AXES), default="env_steps",
                   help="x axis: env steps or wall time in seconds (default env_steps)")
    p.add_argument("--y", dest="y_keys", nargs="+", default=["episode_return_mean"], metavar="KEY",
                   help="metrics.jsonl keys, one subplot each (default episode_return_mean); a * stands for one "
                        "part of a key and draws every key it matches, one line each: 'member/*/episode_return_mean' "
                        "draws each member of a population (quote it in the shell); put the RUN_DIRs before --y, "
                        "which takes every word up to the next option")
    p.add_argument("--out", required=True, metavar="PATH.png", help="the figure to write")
    args = p.parse_args(argv)
    try:
        path, groups = plot_learning_curves([Path(d) for d in args.run_dirs], args.x_key, args.y_keys, Path(args.out))
    except (ValueError, OSError) as exc:  # PlotError, ConfigError, unreadable files; _user_errors() imports torch
        return _fail("fastrl-plot", exc)
    lines = [f"{group.legend(len(group.runs))}: {', '.join(str(run.path) for run in group.runs)}" for group in groups]
    write_best_effort(sys.stdout, "\n".join([f"wrote {path}", *lines]))
    return 0


if __name__ == "__main__":
    sys.exit(train_main())
