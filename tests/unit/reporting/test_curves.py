"""fastrl-plot on synthetic run directories: which runs are one experiment, the mean and band
against numpy by hand, the figure, and one-line errors."""
import json
import sys

import numpy as np
import pytest

from fastrl.cli import plot_main
from fastrl.config import build_config, to_toml
from fastrl.reporting.curves import group_by_seed, load_run, read_metrics, seed_band, series


def make_run(path, rows, **overrides):
    """A run directory as fastrl-train leaves it: config.toml (cartpole-appo + ``overrides``,
    dots spelled as __) and ``rows`` as metrics.jsonl (a string row is written as it is)."""
    path.mkdir()
    cfg = build_config("cartpole-appo", {key.replace("__", "."): value for key, value in overrides.items()})
    (path / "config.toml").write_text(to_toml(cfg))
    (path / "metrics.jsonl").write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n"
                                                for row in rows))
    return path


def rows_of(steps, returns):
    return [{"env_steps": s, "wall_time": s / 100, "episode_return_mean": r, "fps": 100.0}
            for s, r in zip(steps, returns)]


ROWS = rows_of([1000, 2000, 3000], [10.0, 20.0, 30.0])


def test_runs_differing_only_in_seed_are_one_group(tmp_path):
    dirs = [make_run(tmp_path / "a", ROWS, seed=1, learner__lr=3e-4),
            make_run(tmp_path / "b", ROWS, seed=2, learner__lr=3e-4, report_every_s=1.0),  # reporting: same experiment
            make_run(tmp_path / "c", ROWS, seed=1, learner__lr=1e-3),
            make_run(tmp_path / "d", ROWS, seed=3, learner__lr=3e-4),
            make_run(tmp_path / "e", ROWS, seed=2, learner__lr=1e-3)]
    groups = group_by_seed([load_run(d) for d in dirs])
    assert [[run.path.name for run in g.runs] for g in groups] == [["a", "b", "d"], ["c", "e"]]
    assert [g.legend(len(g.runs)) for g in groups] == ["CartPole-v1 learner.lr=0.0003 (3 seeds)",
                                                       "CartPole-v1 learner.lr=0.001 (2 seeds)"]


def test_a_budget_is_part_of_the_experiment_and_a_repeated_seed_is_a_run(tmp_path):
    dirs = [make_run(tmp_path / "a", ROWS, seed=1, train_for_env_steps=9000),
            make_run(tmp_path / "b", ROWS, seed=1, train_for_env_steps=9000),
            make_run(tmp_path / "c", ROWS, seed=1, train_for_env_steps=5000)]
    groups = group_by_seed([load_run(d) for d in dirs])
    assert [g.legend(len(g.runs)) for g in groups] == ["CartPole-v1 train_for_env_steps=9000 (2 runs)",
                                                       "CartPole-v1 train_for_env_steps=5000 (1 seed)"]


def test_a_screen_of_one_key_changes_names_only_each_groups_change(tmp_path):
    dirs = [make_run(tmp_path / "base", ROWS, seed=1),
            make_run(tmp_path / "lr", ROWS, seed=1, learner__lr=1e-3),
            make_run(tmp_path / "gamma", ROWS, seed=1, learner__gamma=0.9),
            make_run(tmp_path / "base2", ROWS, seed=2)]
    groups = group_by_seed([load_run(d) for d in dirs])
    assert [g.legend(len(g.runs)) for g in groups] == ["CartPole-v1 (the others' common settings) (2 seeds)",
                                                       "CartPole-v1 learner.lr=0.001 (1 seed)",
                                                       "CartPole-v1 learner.gamma=0.9 (1 seed)"]


def test_a_key_split_evenly_is_named_by_every_group(tmp_path):
    dirs = [make_run(tmp_path / "a", ROWS, learner__lr=1e-3, learner__gamma=0.9),
            make_run(tmp_path / "b", ROWS, learner__lr=1e-3),
            make_run(tmp_path / "c", ROWS, learner__lr=2e-3),
            make_run(tmp_path / "d", ROWS, learner__lr=2e-3, learner__gamma=0.9)]
    labels = [g.label for g in group_by_seed([load_run(d) for d in dirs])]
    default = build_config("cartpole-appo", {}).learner.gamma
    assert labels == ["CartPole-v1 learner.gamma=0.9 learner.lr=0.001",
                      f"CartPole-v1 learner.gamma={default} learner.lr=0.001",
                      f"CartPole-v1 learner.gamma={default} learner.lr=0.002",
                      "CartPole-v1 learner.gamma=0.9 learner.lr=0.002"]


def test_band_is_the_mean_min_max_where_every_seed_has_data():
    a = (np.array([0.0, 10, 20, 30]), np.array([0.0, 1, 2, 3]))
    b = (np.array([5.0, 15, 25, 35]), np.array([10.0, 30, 10, 30]))
    band = seed_band([a, b])
    grid = np.array([5.0, 10, 15, 20, 25, 30])  # both runs' points inside [5, 30]
    values = np.stack([np.interp(grid, *a), np.interp(grid, *b)])
    assert np.array_equal(band.x, grid)
    assert np.allclose(band.mean, values.mean(axis=0)) and np.allclose(band.low, values.min(axis=0))
    assert np.allclose(band.high, values.max(axis=0))
    # By hand at x=10: a=1, b halfway from 10 to 30 = 20.
    assert band.mean[1] == pytest.approx(10.5) and band.low[1] == 1 and band.high[1] == 20
    single = seed_band([a])
    assert np.array_equal(single.x, a[0]) and np.array_equal(single.mean, a[1])


def test_series_skips_nulls_and_keeps_the_resumed_attempt():
    rows = [{"env_steps": 100, "episode_return_mean": None}, {"env_steps": 200, "episode_return_mean": 1.0},
            {"env_steps": 300, "episode_return_mean": 2.0}, {"env_steps": 400},
            # resumed from the checkpoint at 250: the reports at 300 and 400 were redone
            {"env_steps": 250, "episode_return_mean": 5.0}, {"env_steps": 350, "episode_return_mean": 6.0}]
    x, y = series(read_metrics(rows, ["env_steps", "episode_return_mean"]), "env_steps", "episode_return_mean")
    assert x.tolist() == [200, 250, 350] and y.tolist() == [1.0, 5.0, 6.0]


def test_plot_main_draws_one_subplot_per_key(tmp_path, capsys):
    make_run(tmp_path / "a", ROWS, seed=1)
    make_run(tmp_path / "b", rows_of([1500, 2500, 3500], [None, 25.0, 35.0]) + ['{"env_steps": 40'], seed=2)
    out = tmp_path / "curves.png"
    argv = [str(tmp_path / "a"), str(tmp_path / "b"), "--x", "wall_time", "--y", "episode_return_mean", "fps",
            "--out", str(out)]
    assert plot_main(argv) == 0  # a partial last line (a run killed mid-report) is skipped
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "CartPole-v1 (2 seeds)" in printed


@pytest.mark.parametrize("make, extra, message", [
    (lambda d: d.mkdir(), [], "no metrics in"),
    (lambda d: None, [], "does not exist"),
    (lambda d: make_run(d, ROWS), ["--y", "episode_retrun_mean"],
     "--y episode_retrun_mean: not in these runs' metrics; keys present: env_steps, episode_return_mean, fps, "
     "wall_time"),
    (lambda d: make_run(d, ["{oops", *ROWS]), [], "line 1 is not JSON"),
    (lambda d: make_run(d, ["[1, 2]", *ROWS]), [], "line 1 is not a JSON object"),
    (lambda d: (make_run(d, []) / "metrics.jsonl").write_bytes(b'{"env_steps": 1}\n{"fps": "\xff"}\n{}\n'), [],
     "metrics.jsonl line 2 is not UTF-8 text"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, make, extra, message):
    make(tmp_path / "run")
    assert plot_main([str(tmp_path / "run"), *extra, "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastrl-plot: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "p.png").exists()


def test_plot_main_prints_the_file_it_wrote_and_refuses_a_format_matplotlib_cannot_write(tmp_path, monkeypatch,
                                                                                          capsys):
    make_run(tmp_path / "run", ROWS)
    monkeypatch.chdir(tmp_path)
    assert plot_main(["run", "--out", "curves"]) == 0  # savefig adds .png
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[0] == f"wrote {tmp_path / 'curves.png'}"
    assert plot_main(["run", "--out", "curves.xyz"]) == 2
    err = capsys.readouterr().err
    assert "--out curves.xyz: matplotlib cannot write '.xyz' files; end the name in one of" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "curves.xyz").exists()


def test_a_number_beyond_a_float_is_skipped_as_a_null_is(tmp_path, capsys):
    rows = [ROWS[0], {"env_steps": 1500, "episode_return_mean": 10**400}, *ROWS[1:]]
    make_run(tmp_path / "run", rows)
    assert plot_main([str(tmp_path / "run"), "--out", str(tmp_path / "p.png")]) == 0
    x, y = series(load_run(tmp_path / "run", ["env_steps", "episode_return_mean"]).metrics, "env_steps",
                  "episode_return_mean")
    assert x.tolist() == [1000, 2000, 3000] and y.tolist() == [10.0, 20.0, 30.0]


def test_without_matplotlib_the_error_names_the_extra(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "run", ROWS)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert plot_main([str(tmp_path / "run"), "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'fastrl[plot]'" in err and len(err.strip().splitlines()) == 1


def test_evaluations_are_drawn_where_their_weights_were_taken():
    rows = [{"env_steps": 100, "episode_return_mean": 1.0},
            {"env_steps": 200, "episode_return_mean": 2.0, "eval_return_mean": 9.0, "eval_at_env_steps": 120},
            {"env_steps": 300, "episode_return_mean": 3.0},
            {"env_steps": 400, "episode_return_mean": 4.0, "eval_return_mean": 11.0, "eval_at_env_steps": 310}]
    metrics = read_metrics(rows, ["env_steps", "wall_time", "eval_return_mean", "eval_at_env_steps"])
    x, y = series(metrics, "env_steps", "eval_return_mean")
    assert x.tolist() == [120.0, 310.0] and y.tolist() == [9.0, 11.0]
    x, y = series(metrics, "wall_time", "eval_return_mean")  # no wall time in these rows
    assert x.size == 0


def test_metrics_are_read_a_report_at_a_time_into_the_columns_asked_for(tmp_path):
    import tracemalloc

    rows = [{"env_steps": step, **{f"key_{k}": step * k / 7 for k in range(60)}} for step in range(2000)]
    make_run(tmp_path / "run", rows)
    size = (tmp_path / "run" / "metrics.jsonl").stat().st_size
    tracemalloc.start()
    try:
        run = load_run(tmp_path / "run", ["env_steps", "key_7"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert set(run.metrics.columns) == {"env_steps", "key_7"} and run.metrics.reports == 2000
    assert run.metrics.columns["key_7"].dtype == np.float64
    assert run.metrics.columns["key_7"].tolist() == [row["key_7"] for row in rows]
    assert len(run.metrics.keys) == 61
    assert peak < size / 4  # neither the file nor its reports as dicts are ever held whole


def member_rows(members, steps=(1000, 2000, 3000)):
    """Reports of a population: every member's return (member k's k + 10 * the report's index),
    member ``members - 1`` first reported at the second report, and its learning rate."""
    rows = []
    for i, step in enumerate(steps):
        row = {"env_steps": step, "wall_time": step / 100, "episode_return_mean": 1.0 + i}
        for k in range(members):
            if k < members - 1 or i:
                row[f"member/{k}/episode_return_mean"] = k + 10.0 * i
                row[f"member/{k}/learner/lr"] = 1e-3 * (k + 1)
        rows.append(row)
    return rows


def drawn_figure(monkeypatch):
    """The figure plot_learning_curves saves, kept open for the test."""
    import fastrl.reporting.curves

    figures = []
    monkeypatch.setattr(fastrl.reporting.curves, "save", lambda plt, fig, path: (figures.append(fig),
                                                                                  fig.savefig(path)))
    return figures


def test_a_star_draws_every_member_of_a_population_as_its_own_line(tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "pbt", member_rows(11), pbt__population=11, env__envs_per_worker=1100)
    figures = drawn_figure(monkeypatch)
    out = tmp_path / "members.png"
    assert plot_main([str(tmp_path / "pbt"), "--y", "member/*/episode_return_mean", "member/*/learner/lr",
                      "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    returns, rates = figures[0].axes
    names = [f"member/{k}" for k in range(11)]  # numbers in their order: member/10 last
    assert [line.get_label() for line in returns.get_lines()] == [f"{name}: CartPole-v1 (1 seed)" for name in names]
    assert [line.get_label() for line in rates.get_lines()] == [f"{name}: CartPole-v1 (1 seed)" for name in names]
    for k, line in enumerate(returns.get_lines()):
        x, y = line.get_data()
        expected = [1000, 2000, 3000] if k < 10 else [2000, 3000]  # the last member from its first report on
        assert list(x) == expected and list(y) == [k + 10.0 * i for i in range(3 - len(expected), 3)]
    assert returns.get_title() == "episode return (mean of recent training episodes): member/*/episode_return_mean"
    assert rates.get_title() == "member/*/learner/lr"


def test_a_star_matches_one_part_of_a_key_and_groups_stay_apart(tmp_path, monkeypatch):
    make_run(tmp_path / "a", member_rows(2), seed=1, learner__lr=1e-3)
    make_run(tmp_path / "b", member_rows(2), seed=1, learner__lr=3e-3)
    figures = drawn_figure(monkeypatch)
    assert plot_main([str(tmp_path / "a"), str(tmp_path / "b"), "--y", "member/*/lr", "member/*/learner/lr",
                      "--out", str(tmp_path / "p.png")]) == 2  # member/0/learner/lr is two parts past member/
    figures.clear()
    assert plot_main([str(tmp_path / "a"), str(tmp_path / "b"), "--y", "member/*/episode_return_mean",
                      "--out", str(tmp_path / "p.png")]) == 0
    assert [line.get_label() for line in figures[0].axes[0].get_lines()] == [
        "member/0: CartPole-v1 learner.lr=0.001 (1 seed)", "member/1: CartPole-v1 learner.lr=0.001 (1 seed)",
        "member/0: CartPole-v1 learner.lr=0.003 (1 seed)", "member/1: CartPole-v1 learner.lr=0.003 (1 seed)"]


def test_a_star_that_matches_nothing_is_one_line(tmp_path, capsys):
    make_run(tmp_path / "run", ROWS)
    assert plot_main([str(tmp_path / "run"), "--y", "member/*/episode_return_mean", "--out",
                      str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "--y member/*/episode_return_mean: matches no key of these runs' metrics; keys present: env_steps" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "p.png").exists()
