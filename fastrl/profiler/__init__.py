"""fastrl-profile: how fast each part runs, which part limits the rest, and which knob to turn.

One invocation measures, on the same cores and with the same env settings:

  raw env    ``env.num_workers`` processes step their env groups (same splits, threads, affinity)
             with random actions: the honest limit of this process layout;
  sampling   ``train()`` with ``sample_only``: rollout + inference, slots handed straight back;
  training   ``train()``: the whole pipeline.

Each run is measured in steady state: start-up (seconds of spawning and importing) varies with
the machine's load, so a training run lasts a start-up allowance + warm-up + the measured
seconds, and the window opens ``warmup_s`` after the reports show the pipeline flowing
(``steady_window``); the rate is taken between that report and the last. The cumulative
component timings of those two reports give the breakdown (``breakdown``; it works on any two
lines of a metrics.jsonl), and ``diagnose`` turns a breakdown into one line naming the
bottleneck and the knob. CPU and RSS of every process come
from a thread of the profiler process that samples the pids in processes.json, so the measured
processes carry no profiling code. ``autotune`` searches the throughput knobs with short runs.

Modules, each importing only those above it:

  diagnosis  steady window, breakdown and diagnosis: pure functions on metrics reports; errors
  sampling   CPU, RSS and GPU use of a run's processes, from a thread; the hardware
  rawenv     raw env throughput: the env groups with random actions, no trainer
  measure    ``train()`` runs measured, and ``profile``: all three into a ``ProfileResult``
  tuning     autotune: the search over the throughput knobs (``Autotuner``), into an ``AutotuneResult``
  plot       matplotlib helpers (the optional ``plot`` extra) and the profile's PNG
  report     the tables and the JSON
  main       fastrl-profile's ``command``

Heavy imports (torch, the runner) stay inside functions: the raw env processes import this
package and, like rollout workers, should not pay for torch.
"""
from ..reporting.figures import PlotError
from .diagnosis import (
                        BUSY,
                        CPU_SATURATED,
                        GROUPS,
                        MIN_WINDOW_S,
                        STARTUP_MARGIN,
                        WAIT,
                        Diagnosis,
                        LateStart,
                        ProfileError,
                        breakdown,
                        diagnose,
                        share_keys,
                        steady_window,
)
from .main import command
from .measure import (
                        DEFAULT_SECONDS,
                        STARTUP_ESTIMATE_S,
                        ProfileResult,
                        RunMeasurement,
                        default_warmup,
                        measure_run,
                        measure_run_patiently,
                        profile,
)
from .plot import plot_profile, pyplot
from .rawenv import EnvMeasurement, legal_random_actions, measure_env, random_action_table
from .report import format_autotune, format_report, write_json
from .sampling import ProcessSampler, cores_used, cpu_count, gpu_query, hardware, parse_nvidia_smi
from .tuning import (
                        DEFAULT_BUDGET_S,
                        DEFAULT_TRIAL_SECONDS,
                        TUNED_KEYS,
                        Autotuner,
                        AutotuneResult,
                        Trial,
                        autotune,
                        candidate_values,
                        get_key,
                        set_args,
                        tuned_keys,
                        with_settings,
)

__all__ = [
    "BUSY", "CPU_SATURATED", "DEFAULT_BUDGET_S", "DEFAULT_SECONDS", "DEFAULT_TRIAL_SECONDS", "GROUPS",
    "MIN_WINDOW_S", "STARTUP_ESTIMATE_S", "STARTUP_MARGIN", "TUNED_KEYS", "WAIT",
    "AutotuneResult", "Autotuner", "Diagnosis", "EnvMeasurement", "LateStart", "PlotError", "ProcessSampler",
    "ProfileError", "ProfileResult", "RunMeasurement", "Trial",
    "autotune", "breakdown", "candidate_values", "command", "cores_used", "cpu_count", "default_warmup",
    "diagnose", "format_autotune", "format_report", "get_key", "gpu_query", "hardware", "legal_random_actions",
    "measure_env", "measure_run", "measure_run_patiently", "parse_nvidia_smi", "plot_profile", "profile", "pyplot",
    "random_action_table", "set_args", "share_keys", "steady_window", "tuned_keys", "with_settings", "write_json",
]
