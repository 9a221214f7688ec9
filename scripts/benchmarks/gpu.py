"""The GPU report in one call: every GPU figure fastrl states, measured in a few minutes.

    python scripts/bench.py gpu [--out DIR] [--minutes M] [--device cuda|cpu] [--quick]

Writes OUT/report.json and OUT/report.md (default OUT: runs/bench_gpu), naming the hardware
(GPU model and memory, driver, CUDA, cuDNN and torch versions, CPU model, cores and flags), with
one part per section, in this order:

  hardware    what the figures were taken on
  tests       the tests marked ``gpu`` (pytest -m gpu), pass / fail / skip per test
  syncs       host synchronisations per call on the device, beside the CPU-forced upper bound the
              tests bound (benchmarks.syncs): APPO and DQN train(), an R2D2 gradient step
  precision   float32 against bf16 learner time per train() on the device (benchmarks.learner)
  throughput  raw env, sampling and training env steps/s and the bottleneck (fastrl.profiler) of
              atari-appo (Pong), cartpole-appo, and atari-appo with its batcher on the CPU
  learning    atari-appo trained for the time left, its curve beside its promise's threshold

and the GPUs' memory and utilisation over each section (NVML through nvidia-ml-py, else
nvidia-smi, else torch.cuda's allocator counts of the section's own process).

Each section runs in its own process (``--section NAME``, which writes OUT/sections/NAME.json
after every row it measures) under its own time budget: its share of what is left of the total
(``share_of_remaining``), at least its minimum, or it is skipped. A section past its budget is
interrupted (SIGINT, as Ctrl-C: a run stops its processes) and keeps the rows it measured; a
failed section is recorded and the next one runs. The report is written after every section,
so an interrupted report keeps what was measured. ``--quick`` shrinks every section to run the
same code on the CPU within 2 minutes (tests/benchmarks/test_bench_gpu.py): cartpole-appo with 64 envs a
worker in place of atari-appo, one call per timing. Rows that cannot be measured say why
("no CUDA device").
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.etree import ElementTree

from fastrl.files.run_dir import write_atomic

from .learning import positive

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench.py"
DEFAULT_MINUTES = 8.0
QUICK_MINUTES = 2.0  # a ceiling: each section ends when it has measured, most well before their share
REPORT_RESERVE_S = 3.0  # kept back from the sections for the last report and the parent's exit
OVERRUN_S = 5.0  # a section past its budget may finish what it is doing for this long (a run's shutdown)
STOP_GRACE_S = 10.0  # from SIGINT until a section's process group is killed
NO_CUDA = "no CUDA device"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    share: float  # of the time left when it starts, against the sections after it
    minimum_s: float  # less than this left: skipped


SECTIONS = (
    Section("hardware", "Hardware", 0.01, 10.0),
    Section("tests", "Tests marked gpu", 0.12, 15.0),
    Section("syncs", "Host synchronisations per call", 0.08, 20.0),
    Section("precision", "float32 against bf16 learner time", 0.08, 15.0),
    Section("throughput", "Throughput and bottleneck", 0.38, 30.0),
    Section("learning", "Learning", 0.33, 30.0),
)
BY_NAME = {section.name: section for section in SECTIONS}


# The budget: pure functions, tested in tests/benchmarks/test_bench_gpu.py.

def share_of_remaining(remaining_s: float, shares: list[float]) -> float:
    """Seconds for the first of ``shares`` (it and the ones after it) out of ``remaining_s``:
    its share of what is left, so time a section does not use goes to the later ones and a
    section that overran takes it from them."""
    if remaining_s <= 0 or not shares:
        return 0.0
    return remaining_s * shares[0] / sum(shares)


def section_budget(remaining_s: float, sections: list[Section]) -> float | None:
    """Seconds the first of ``sections`` may take: its share of ``remaining_s``, raised to its
    minimum where that is left; None (skip it) where less than its minimum is left."""
    first = sections[0]
    if remaining_s < first.minimum_s:
        return None
    return min(remaining_s, max(first.minimum_s, share_of_remaining(remaining_s, [s.share for s in sections])))


def profile_seconds(budget_s: float, quick: bool) -> float | None:
    """Steady-state seconds of each of a profile's three runs (fastrl.profiler.profile) that fit
    ``budget_s``: raw env (warm-up + seconds), then sampling and training (start-up allowance +
    warm-up + seconds each); None where not even the shortest window fits."""
    from fastrl.profiler import MIN_WINDOW_S, STARTUP_ESTIMATE_S, default_warmup
    seconds = (budget_s - 2 * STARTUP_ESTIMATE_S) / 3
    seconds -= default_warmup(seconds)
    floor = 2 * MIN_WINDOW_S
    if seconds < floor:
        return None
    return floor if quick else seconds


class Budget:
    """The total budget on ``clock``'s seconds, from when it is made. Its ``deadline`` is the last
    moment a section may be told to stop: after it, STOP_GRACE_S to stop and REPORT_RESERVE_S to
    write the report still fit the total."""

    def __init__(self, total_s: float, clock=time.monotonic):
        self.clock = clock
        self.deadline = clock() + total_s - REPORT_RESERVE_S - STOP_GRACE_S

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def for_section(self, sections: list[Section]) -> float | None:
        return section_budget(self.remaining(), sections)

    def wait_s(self, section_s: float) -> float:
        """How long to wait for a section of ``section_s`` before stopping it: its budget and
        OVERRUN_S, never past the deadline."""
        return min(section_s + OVERRUN_S, self.remaining())


# The report: written after every section.

def write_report(report: dict, out: Path) -> None:
    write_atomic(out / "report.json", json.dumps(report, indent=1) + "\n")
    write_atomic(out / "report.md", markdown(report))


def _fmt(value, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict) -> str:
    """report.md: the hardware, then one table per section (or why it has none)."""
    lines = ["# fastrl GPU report", "",
             f"`{report['command']}`: device {report['device']}{', quick' if report['quick'] else ''}, budget "
             f"{report['budget_s']:.0f} s, {report.get('wall_s', 0):.0f} s measured"
             f"{'' if report.get('finished') else ' (unfinished: interrupted or still running)'}.", ""]
    for section in SECTIONS:
        result = report["sections"].get(section.name)
        lines += [f"## {section.title}", ""]
        if result is None:
            lines += ["Not reached.", ""]
            continue
        status = result["status"]
        if status != "ok":
            why = result.get("reason") or result.get("error") or ""
            lines += [f"**{status}**{': ' + why if why else ''}", ""]
        lines += RENDER[section.name](result) + [""]
    lines += ["## GPU memory and utilisation", ""] + render_gpu_use(report.get("gpu_use", {})) + [""]
    return "\n".join(lines)


def render_hardware(result: dict) -> list[str]:
    if "cpu_model" not in result:
        return []
    flags = ", ".join(result["cpu_flags_of_note"]) or "none of note"
    gpus = "; ".join(f"{g['name']}, {_fmt(g['memory_mib'])} MiB, compute capability {g['capability']}"
                     for g in result["gpus"]) or "none"
    return ["| | |", "|---|---|",
            f"| GPU | {gpus} |", f"| driver | {result['driver'] or '-'} |",
            f"| CUDA (torch's) | {result['cuda'] or '-'} |", f"| cuDNN | {result['cudnn'] or '-'} |",
            f"| torch | {result['torch']} |", f"| python | {result['python']} |",
            f"| CPU | {result['cpu_model']}, {result['cpu_count']} cores usable of {result['cpu_count_total']} |",
            f"| CPU flags | {flags} |"]


def render_tests(result: dict) -> list[str]:
    tests = result.get("tests", [])
    if not tests:
        return []
    counts = {outcome: sum(t["outcome"] == outcome for t in tests) for outcome in ("passed", "failed", "skipped")}
    lines = [", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + ".", "", "| test | outcome | why |",
             "|---|---|---|"]
    return lines + [f"| `{t['test']}` | {t['outcome']} | {t['message']} |" for t in tests]


def render_rows(result: dict, header: list[str], row) -> list[str]:
    rows = result.get("rows", {})
    if not rows:
        return []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, figures in rows.items():
        cells = row(figures) if figures.get("status", "ok") == "ok" else \
            [f"{figures['status']}: {figures.get('reason') or figures.get('error')}"] + [""] * (len(header) - 2)
        lines.append("| " + " | ".join([name] + cells) + " |")
    return lines


def render_syncs(result: dict) -> list[str]:
    return render_rows(result, ["call", "syncs on the device", "to host", "to device", "CPU-forced upper bound"],
                       lambda r: [_fmt(r["device"] and r["device"]["syncs"], "g"),
                                  _fmt(r["device"] and r["device"]["to_host"], "g"),
                                  _fmt(r["device"] and r["device"]["to_device"], "g"),
                                  _fmt(r["cpu_forced"]["syncs"], "g")])


def render_precision(result: dict) -> list[str]:
    head = [f"{result['profile']} on {result['device']}, T={result['rollout']} B={result['trajectories']}", ""] \
        if "profile" in result else []
    return head + render_rows(result, ["precision", "ms per train()", "env steps/s (learner alone)"],
                              lambda r: [_fmt(r["seconds_per_call"] * 1e3, ".1f"), _fmt(r["env_steps_per_s"])])


def render_throughput(result: dict) -> list[str]:
    return render_rows(result, ["run", "raw env steps/s", "sampling", "training", "training / raw", "bottleneck"],
                       lambda r: [_fmt(r["env_fps"]), _fmt(r["sample_fps"]), _fmt(r["train_fps"]),
                                  _fmt(r["train_ratio"], ".2f"), f"{r['bottleneck']}: {r['diagnosis']}"])


def render_learning(result: dict) -> list[str]:
    if "outcome" not in result:
        return []
    o, p = result["outcome"], result["promise"]
    first = (f"first reached at {o['first_env_steps']:,} env steps, {o['first_wall_time']:.0f} s"
             if o["first_env_steps"] is not None else "never reached")
    lines = [f"{result['profile']} on {result['device']}: {o['last_env_steps']:,} env steps in "
             f"{o['last_wall_time']:.0f} s, start-up included; {p['metric']} final {_fmt(o['final'], '.1f')}, max "
             f"{_fmt(o['max'], '.1f')}, {_fmt(o['final_mean'], '.1f')} over the run's last stretch; the promise's "
             f"threshold {p['threshold']:g} {first}."]
    if result.get("plot"):
        lines += ["", f"![{result['profile']} learning curve]({result['plot']})"]
    elif result.get("plot_error"):
        lines += ["", f"No curve: {result['plot_error']}"]
    return lines


def render_gpu_use(use: dict) -> list[str]:
    if use.get("status") != "ok":
        return [f"**skipped**: {use.get('reason', 'not measured')}"]
    lines = [f"Source: {use['source']}.", "", "| section | GPU | mean utilisation % | peak memory MiB | of MiB |",
             "|---|---|---|---|---|"]
    for name, gpus in use["sections"].items():
        for g in gpus:
            lines.append(f"| {name} | {g['index']}: {g['name']} | {_fmt(g['util_percent'], '.0f')} | "
                         f"{_fmt(g['memory_used_mib'])} | {_fmt(g['memory_total_mib'])} |")
    return lines


RENDER = {"hardware": render_hardware, "tests": render_tests, "syncs": render_syncs,
          "precision": render_precision, "throughput": render_throughput, "learning": render_learning}


# The sections, each run in its own process.

class Context:
    """What a section is given: its budget, the device, --quick, and ``save`` for its figures so
    far (OUT/sections/NAME.json), which the parent reads whether the section ends or is stopped."""

    def __init__(self, name: str, seconds: float, device: str, quick: bool, out: Path):
        self.name, self.seconds, self.device, self.quick, self.out = name, seconds, device, quick, out
        self.start = time.monotonic()
        self.figures: dict = {"status": "ok", "budget_s": seconds}

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def save(self, **figures) -> None:
        self.figures.update(figures)
        write_atomic(section_file(self.out, self.name), json.dumps(self.figures) + "\n")

    def save_row(self, name: str, row: dict) -> None:
        self.save(rows={**self.figures.get("rows", {}), name: row})

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def profile(self, full: str) -> str:
        """atari-appo's sections use cartpole-appo with --quick: Pong's CNN takes seconds a call on a CPU."""
        return "cartpole-appo" if self.quick else full

    def run_settings(self) -> dict:
        """What a training run sets on top of its profile: the device, and with --quick 64 envs a
        worker (cartpole-appo's 1,024 take seconds to start on a busy CPU)."""
        return {"device": self.device, **({"env.envs_per_worker": 64} if self.quick else {})}

    def spent(self, row: str) -> bool:
        """True, with ``row`` saved as skipped, once the section's budget is spent."""
        if self.left() > 0:
            return False
        self.save_row(row, {"status": "skipped", "reason": f"budget: the section's {self.seconds:.0f} s were spent"})
        return True


def section_file(out: Path, name: str) -> Path:
    return out / "sections" / f"{name}.json"


def cpu_flags_of_note(flags: set[str]) -> list[str]:
    """The flags fastrl's speed depends on: SIMD width, and native bf16 (fastrl.learner.precision)."""
    return sorted(flags & {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx_vnni"})


def driver_version() -> str | None:
    """The NVIDIA driver's version from NVML or nvidia-smi; None without either."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else version  # older releases return bytes
        except pynvml.NVMLError:  # no driver: nvidia-smi will not know either, but costs nothing to ask
            pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def measure_hardware(ctx: Context) -> None:
    import platform

    import torch

    from fastrl.learner.precision import cpu_flags
    from fastrl.profiler import hardware
    machine = hardware()
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"name": props.name, "memory_mib": props.total_memory / 2**20,
                         "capability": f"{props.major}.{props.minor}"})
    flags = cpu_flags()
    ctx.save(cpu_model=machine["cpu_model"], cpu_count=machine["cpu_count"],
             cpu_count_total=machine["cpu_count_total"], cpu_flags=sorted(flags),
             cpu_flags_of_note=cpu_flags_of_note(flags), gpus=gpus, driver=driver_version(),
             cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
             else None, torch=torch.__version__, python=platform.python_version())
    if not gpus:
        ctx.save(note=NO_CUDA)


def junit_tests(path: Path) -> list[dict]:
    """pytest's --junitxml file as [{test, outcome (passed | failed | skipped), message}]."""
    rows = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                message = (child.get("message") or "").splitlines()[0][:200] if child.get("message") else ""
                break
        rows.append({"test": test, "outcome": outcome, "message": message.replace("|", "/")})
    return rows


def gpu_test_files(tests: Path) -> list[str]:
    """The test files that mark tests ``gpu`` (``pytest.mark.gpu``): collecting only them saves
    importing the whole suite, ten seconds of a GPU's minutes."""
    return [str(path.relative_to(tests.parent)) for path in sorted(tests.rglob("test_*.py"))
            if "mark.gpu" in path.read_text(encoding="utf-8")]


def measure_tests(ctx: Context) -> None:
    if not (ROOT / "tests").is_dir():
        ctx.save(status="skipped", reason=f"no tests/ in {ROOT}: run the report from a checkout of fastrl")
        return
    xml = ctx.out / "tests.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={xml}",
               *gpu_test_files(ROOT / "tests")]
    log = ctx.out / "logs" / "pytest.log"
    with open(log, "w") as output:
        pytest = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            pytest.wait(max(1.0, ctx.left() - 3))
        except subprocess.TimeoutExpired:
            # pytest stops at a KeyboardInterrupt and still writes the report of the tests it ran.
            pytest.send_signal(signal.SIGINT)
            pytest.wait()
            ctx.save(status="stopped", reason=f"pytest ran past the section's {ctx.seconds:.0f} s; the tests "
                                              f"below ran before it")
    if not xml.is_file():
        ctx.save(status="failed", error=f"pytest exited {pytest.returncode} without a report: {last_line(log)}")
        return
    ctx.save(tests=junit_tests(xml), summary=last_line(log), exit_code=pytest.returncode)


def measure_syncs(ctx: Context) -> None:
    import torch

    from . import syncs
    calls = 1 if ctx.quick else 3
    # (row, what it counts: f(device) -> counts per call)
    components = [
        ("VTraceLearner.train (APPO, device path)", lambda device: syncs.vtrace_train(device, calls, True)),
        ("DQNLearner.train", lambda device: syncs.dqn(device, calls)[0]),
        ("R2D2Learner.update (one gradient step)", lambda device: syncs.r2d2_update(device, calls)),
    ]
    ctx.save(calls=calls, device=ctx.device, note=None if ctx.cuda else f"{NO_CUDA}: the CPU-forced counts only")
    for name, count in components:
        if ctx.spent(name):
            continue
        try:
            row = {"device": count(torch.device(ctx.device)) if ctx.cuda else None,
                   "cpu_forced": count(torch.device("cpu"))}
        except Exception as exc:  # one component's failure is a finding; the others still count
            row = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        ctx.save_row(name, row)


def measure_precision(ctx: Context) -> None:
    import torch

    from fastrl.config import build_config
    from fastrl.envs import probe_env
    from fastrl.learner import make_learner

    from .learner import random_batch, seconds_per_call
    profile = ctx.profile("atari-appo")
    calls, rounds = (1, 1) if ctx.quick else (3, 3)
    spec = batch = None
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    learners = {}
    for precision in times:
        cfg = build_config(profile, {"device": ctx.device, "learner.precision": precision})
        torch.set_num_threads(cfg.learner.torch_threads)
        spec = spec or probe_env(cfg)
        batch = batch or random_batch(cfg, spec, 0)
        torch.manual_seed(0)
        learners[precision] = make_learner(cfg, spec.observation_space, spec.action_space, device=ctx.device)
    steps = batch.rewards.numel()
    ctx.save(profile=profile, device=ctx.device, rollout=cfg.learner.rollout, trajectories=cfg.trajectories_per_batch,
             calls=calls)
    for r in range(rounds):
        if r and ctx.left() < 2 * sum(statistics.median(t) for t in times.values()) * (calls + 1):
            break  # another round would not fit the section's budget
        for precision, learner in learners.items():
            times[precision].append(seconds_per_call(learner, batch, calls)[0])
            median = statistics.median(times[precision])
            ctx.save_row(precision, {"seconds_per_call": median, "env_steps_per_s": steps / median,
                                     "rounds": len(times[precision]), "resolved": learner.precision})


def throughput_rows(ctx: Context) -> list[tuple[str, str, dict, str | None]]:
    """(row, profile, overrides, why it is skipped or None) of the throughput section."""
    pong = None if not ctx.quick else "--quick measures cartpole-appo only (Pong's CNN is slow on a CPU)"
    batcher = pong or (None if ctx.cuda else f"{NO_CUDA}: the batcher is on the CPU in both")
    return [("atari-appo (batcher on the run's device)", "atari-appo", {}, pong),
            ("cartpole-appo", "cartpole-appo", {}, None),
            ("atari-appo, batcher on the CPU", "atari-appo", {"inference.device": "cpu"}, batcher)]


# The figures of fastrl.profiler.ProfileResult a throughput row keeps.
THROUGHPUT_KEYS = ("env_fps", "sample_fps", "train_fps", "env_frames_per_s", "sample_frames_per_s",
                   "train_frames_per_s", "sample_ratio", "train_ratio", "bottleneck", "diagnosis", "sample_diagnosis",
                   "policy_lag", "cores_used", "gpus", "seconds", "window_s", "startup_s")


def measure_throughput(ctx: Context) -> None:
    from fastrl.config import build_config
    from fastrl.profiler import MIN_WINDOW_S, profile
    rows = throughput_rows(ctx)
    measured = [row for row in rows if row[3] is None]
    for name, profile_name, overrides, skip in rows:
        if skip is not None:
            ctx.save_row(name, {"status": "skipped", "reason": skip})
            continue
        budget = share_of_remaining(ctx.left(), [1.0] * len(measured))
        measured.pop(0)
        seconds = profile_seconds(budget, ctx.quick)
        if seconds is None:
            ctx.save_row(name, {"status": "skipped", "reason": f"budget: {budget:.0f} s left for it, too short"})
            continue
        settings = {**ctx.run_settings(), **overrides}
        try:
            # --quick: the shortest warm-up the profiler takes, since the row checks the path, not the figure.
            warmup = MIN_WINDOW_S if ctx.quick else None
            result = profile(build_config(profile_name, settings), seconds, warmup, profile_name, settings)
        except Exception as exc:  # a failed row is a finding; the next still runs
            ctx.save_row(name, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
            continue
        ctx.save_row(name, {key: getattr(result, key) for key in THROUGHPUT_KEYS} | {"overrides": settings})


# Start-up allowance of the learning run, and the seconds its processes take to stop and checkpoint.
LEARNING_OVERHEAD_S = 25.0
QUICK_LEARNING_STEPS = 30_000


def measure_learning(ctx: Context) -> None:
    from fastrl.config import build_config
    from fastrl.reporting.curves import metrics_rows, plot_learning_curves
    from fastrl.run.training import train

    from .learning import profile_promise, run_outcome
    profile = ctx.profile("atari-appo")
    seconds = ctx.left() - LEARNING_OVERHEAD_S
    if seconds < 5:
        ctx.save(status="skipped", reason=f"budget: {ctx.left():.0f} s left, the run's start-up alone takes "
                                          f"~{LEARNING_OVERHEAD_S:.0f} s")
        return
    # --quick: enough steps for CartPole's first episodes to end and be reported, then stop.
    steps = QUICK_LEARNING_STEPS if ctx.quick else 0
    cfg = build_config(profile, {**ctx.run_settings(), "train_for_seconds": seconds, "train_for_env_steps": steps,
                                 "report_every_s": max(0.5, min(build_config(profile).report_every_s, seconds / 20))})
    promise = profile_promise(profile, cfg.expect)
    run_dir = ctx.out / "learning" / profile
    ctx.save(profile=profile, device=ctx.device, train_seconds=seconds, train_env_steps=steps, promise=asdict(promise),
             run_dir=str(run_dir.relative_to(ctx.out)))
    train(cfg, run_dir=run_dir, quiet=True, overwrite=True)
    outcome = run_outcome(list(metrics_rows(run_dir)), promise)
    ctx.save(outcome=outcome)
    plot = ctx.out / "learning.png"
    try:
        plot_learning_curves([run_dir], "env_steps", [promise.metric], plot,
                             targets={promise.metric: promise.threshold})
        ctx.save(plot=plot.name)
    except ValueError as exc:  # PlotError: matplotlib missing, or no curve to draw
        ctx.save(plot=None, plot_error=str(exc))


MEASURE = {"hardware": measure_hardware, "tests": measure_tests, "syncs": measure_syncs,
           "precision": measure_precision, "throughput": measure_throughput, "learning": measure_learning}


def run_section(args) -> dict:
    """--section NAME: measure one section in this process; its figures go to OUT/sections/NAME.json."""
    ctx = Context(args.section, args.seconds, args.device, args.quick, args.out)
    ctx.save()
    MEASURE[args.section](ctx)
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            ctx.save(torch_cuda_peak_mib=torch.cuda.max_memory_allocated() / 2**20)
    except ImportError:
        pass
    return ctx.figures


# The parent: the sections one after another, each in its own process group.

def stop(process: subprocess.Popen) -> None:
    """SIGINT to the section's process group, as Ctrl-C (a run stops its processes and frees its
    shared memory); SIGKILL to the group if it is still there after STOP_GRACE_S."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.is_file() else []
    return lines[-1][:300] if lines else ""


def run_child(section: Section, seconds: float, wait_s: float, args) -> dict:
    """One section in its own process, stopped after ``wait_s``; its figures, with
    ``status`` ok, skipped, failed (``error``: its last line of output) or stopped (``reason``)."""
    log = args.out / "logs" / f"{section.name}.log"
    command = [sys.executable, str(BENCH), "gpu", "--section", section.name, "--seconds", f"{seconds:.1f}",
               "--out", str(args.out), "--device", args.device] + (["--quick"] if args.quick else [])
    section_file(args.out, section.name).unlink(missing_ok=True)
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        stopped = None
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            stopped = f"stopped at its budget of {seconds:.0f} s"
            stop(process)
        except KeyboardInterrupt:
            stop(process)
            raise
    path = section_file(args.out, section.name)
    figures = json.loads(path.read_text()) if path.is_file() else {"budget_s": seconds}
    if stopped:
        figures.update(status="stopped", reason=stopped + "; the rows above were measured before it")
    elif process.returncode != 0:
        figures.update(status="failed", error=f"exit {process.returncode}: {last_line(log)} (logs/{section.name}.log)")
    return figures


def gpu_use(sampler, windows: dict[str, tuple[float, float]], figures: dict[str, dict], device: str) -> dict:
    """Each section's GPU use: from the sampler (NVML or nvidia-smi), else torch.cuda's peak
    allocation in the section's own process (a run's learner and batcher processes not counted)."""
    if sampler is not None:
        import importlib.util
        source = "NVML (nvidia-ml-py)" if importlib.util.find_spec("pynvml") else "nvidia-smi"
        return {"status": "ok", "source": f"{source}, every GPU, sampled each second",
                "sections": {name: sampler.gpus(*window) for name, window in windows.items()},
                "samples": [[t, gpus] for t, gpus in sampler.gpu_samples]}
    peaks = {name: f["torch_cuda_peak_mib"] for name, f in figures.items() if "torch_cuda_peak_mib" in f}
    if peaks:
        return {"status": "ok", "source": "torch.cuda.max_memory_allocated of each section's own process "
                                          "(no NVML, no nvidia-smi: utilisation unknown; a run's learner and "
                                          "batcher processes are not counted)",
                "sections": {name: [{"index": 0, "name": device, "util_percent": None, "memory_used_mib": mib,
                                     "memory_total_mib": None}] for name, mib in peaks.items()}}
    return {"status": "skipped", "reason": f"{NO_CUDA} (no NVML, no nvidia-smi, no CUDA allocation)"}


def run_report(args) -> dict:
    from fastrl.profiler import ProcessSampler, gpu_query
    minutes = args.minutes or (QUICK_MINUTES if args.quick else DEFAULT_MINUTES)
    args.out.mkdir(parents=True, exist_ok=True)
    for folder in ("sections", "logs"):
        (args.out / folder).mkdir(exist_ok=True)
    budget = Budget(minutes * 60)
    report = {"command": " ".join(["python scripts/bench.py gpu"] + sys.argv[2:]), "device": args.device,
              "quick": args.quick, "budget_s": minutes * 60, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "finished": False, "sections": {}}
    windows: dict[str, tuple[float, float]] = {}
    start = time.monotonic()
    sampler = ProcessSampler(lambda: None) if gpu_query() is not None else None
    if sampler is not None:
        sampler.__enter__()
    try:
        for i, section in enumerate(SECTIONS):
            seconds = budget.for_section(list(SECTIONS[i:]))
            if seconds is None:
                figures = {"status": "skipped", "reason": f"budget: {budget.remaining():.0f} s of the total left, "
                                                          f"the section needs {section.minimum_s:.0f} s"}
            else:
                print(f"[bench gpu] {section.name}: up to {seconds:.0f} s", file=sys.stderr, flush=True)
                t0 = time.time()
                try:
                    figures = run_child(section, seconds, budget.wait_s(seconds), args)
                except KeyboardInterrupt:
                    figures = json.loads(section_file(args.out, section.name).read_text()) \
                        if section_file(args.out, section.name).is_file() else {}
                    report["sections"][section.name] = {**figures, "status": "interrupted"}
                    raise
                finally:
                    windows[section.name] = (t0, time.time())
            report["sections"][section.name] = figures
            report["wall_s"] = time.monotonic() - start
            report["gpu_use"] = gpu_use(sampler, windows, report["sections"], args.device)
            write_report(report, args.out)
        report["finished"] = True
    except KeyboardInterrupt:
        print("[bench gpu] interrupted: the report keeps the sections measured", file=sys.stderr)
    finally:
        if sampler is not None:
            sampler.__exit__(None, None, None)
        report["wall_s"] = time.monotonic() - start
        report["gpu_use"] = gpu_use(sampler, windows, report["sections"], args.device)
        write_report(report, args.out)
    print(markdown(report))
    print(f"report: {args.out / 'report.md'}, {args.out / 'report.json'}")
    return {"report": str(args.out / "report.json"), "wall_s": report["wall_s"], "finished": report["finished"],
            "sections": {name: f["status"] for name, f in report["sections"].items()},
            "tests_failed": [t["test"] for t in report["sections"].get("tests", {}).get("tests", [])
                             if t["outcome"] == "failed"]}


def add_arguments(p) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/bench_gpu"),
                   help="report.json, report.md, the learning curve and logs go here (default runs/bench_gpu)")
    p.add_argument("--minutes", type=positive(float), default=None,
                   help=f"the total budget (default {DEFAULT_MINUTES:g}; {QUICK_MINUTES:g} with --quick)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="where the learner runs (default cuda)")
    p.add_argument("--quick", action="store_true",
                   help="every section shrunk (one call per timing, cartpole-appo for atari-appo): the script's "
                        "own test on the CPU")
    # The parent's call to each section's own process, not the user's.
    p.add_argument("--section", choices=list(MEASURE), help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)


def run(args) -> dict:
    args.out = args.out.absolute()
    if args.section:
        return run_section(args)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device cuda: {NO_CUDA} here; use --device cpu (add --quick for the minute's check)")
    return run_report(args)


ERRORS = (RuntimeError,)


def failed(report: dict) -> bool:
    """Exit 1 when the report did not finish, or a section or a gpu test failed."""
    return "sections" in report and (not report["finished"] or report["tests_failed"]
                                     or any(status == "failed" for status in report["sections"].values()))
