"""The tests of tests/unit/profiler/test_profiler.py's subject that train in this process."""
from fastrl import profiler
from fastrl.config import build_config, validate
from fastrl.run.training import train
from tests.unit.profiler.test_profiler import MASKED_CUE_GAME, SMALL


def test_the_raw_env_of_a_game_that_refuses_masked_moves_moves_legally():
    # The cue game raises on a move its mask forbids: random moves from the whole action space end
    # the raw env process at once.
    env = profiler.measure_env(build_config("cartpole-appo", MASKED_CUE_GAME), 0.5, 0.1)
    assert env.env_steps_per_s > 0

def test_autotune_fits_its_budget_and_its_settings_validate_and_run(tmp_path):
    cfg = build_config("cartpole-appo", SMALL)
    # The first trial is estimated at 15.5 s (start-up 8, warm-up 0.5, 2 measured, overhead 5), after
    # the env id is resolved: up to 2 s where this process has not imported envpool yet (the test alone).
    # The rest, less the 1.2 s reserve, lets a loaded machine's start-up take up to ~13 s.
    budget = 24.0
    result = profiler.autotune(cfg, budget_s=budget, trial_seconds=2.0, warmup_s=0.5, log=lambda message: None)
    assert result.elapsed_s <= budget
    # The profile as given is measured first (again, if a busy machine made it start too late).
    first_ok = next(t for t in result.trials if t.status == "ok")
    assert first_ok.changed == {} and first_ok.train_fps == result.base_fps
    assert all(t.status in ("ok", "invalid", "failed", "late") for t in result.trials)
    assert result.best_fps >= result.base_fps > 0
    assert all(f"--set {key}=" in result.set_args for key in result.best)
    # The TOML is a profile: it loads, validates, and runs.
    (tmp_path / "best.toml").write_text(result.toml)
    best = build_config(str(tmp_path / "best.toml"), {"train_for_env_steps": 5_000, "report_every_s": 1.0})
    validate(best)
    assert {key: profiler.get_key(best, key) for key in result.best} == result.best
    run = train(best, run_dir=tmp_path / "run", quiet=True)
    assert run.final["env_steps"] >= 5_000
