"""The tests of tests/unit/multiagent/test_league.py's subject that train in this process."""
import json
import shutil

import numpy as np
import pytest

from fastrl.files.checkpoint import load_latest_checkpoint
from fastrl.multiagent.league import League, league_dir, saved_snapshots, snapshot_path
from fastrl.run.training import train
from tests.support.training import read_metrics
from tests.unit.multiagent.test_league import count_game_config, league_files, read_snapshot, watch_league_starts


def check_league_run(run_dir, max_snapshots: int = 3):
    """The league on disk is bounded and the metrics report it; returns the snapshot versions."""
    versions = [v for v, _ in saved_snapshots(run_dir)]
    assert len(versions) == max_snapshots
    records = [r for r in read_metrics(run_dir) if r.get("league/games")]
    assert records
    for r in records:
        assert r["league/win_rate"] + r["league/draw_rate"] + r["league/loss_rate"] == pytest.approx(1.0)
        assert 1 <= r["league/snapshots"] <= max_snapshots and np.isfinite(r["league/rating"])
        assert -1.5 <= r["episode_return_mean"] <= 1.5  # the policy's seat: a win, loss or draw
    rated = sorted(int(v) for v in records[-1]["league/snapshot_ratings"])  # the league at that report
    assert len(rated) == records[-1]["league/snapshots"] and rated[-1] <= versions[-1]
    return versions

def test_selfplay_trains_against_its_league_and_resumes_it(tmp_path, monkeypatch):
    taken = {}
    after_update = League.after_update

    def unchanged_snapshots(league, version, flat):
        """Every update: the snapshots in the arena are the weights of the update they were taken at."""
        newest = league.last
        after_update(league, version, flat)
        if league.last != newest:
            taken[league.last] = flat.copy()
        for j, v in enumerate(league.versions):
            if v >= 0:
                out = np.empty_like(flat)
                assert league.buffers[j].read_into(out) == v
                np.testing.assert_array_equal(out, taken[v])

    monkeypatch.setattr(League, "after_update", unchanged_snapshots)
    restored, started = watch_league_starts(monkeypatch)
    train(count_game_config(2_500), run_dir=tmp_path, quiet=True)
    versions = check_league_run(tmp_path)
    assert versions == sorted(taken)[-3:] and len(taken) > 3  # the oldest dropped
    assert sorted(int(v) for v in read_metrics(tmp_path)[-1]["league/snapshot_ratings"]) == versions
    for v, path in saved_snapshots(tmp_path):
        np.testing.assert_array_equal(read_snapshot(path), taken[v])
    results = {int(v): r for v, r in json.loads((league_dir(tmp_path) / "record.json").read_text())["results"].items()}
    assert results and set(results) <= set(versions)
    assert restored == [[]] and started == [{}]
    train(count_game_config(4_000), run_dir=tmp_path, resume=True, quiet=True)
    assert restored[1] == versions and started[1] == results  # the league and its record, as they were
    after = check_league_run(tmp_path)
    assert after[-1] > versions[-1]  # new snapshots of the policy as it trains on
    for v, path in saved_snapshots(tmp_path):
        np.testing.assert_array_equal(read_snapshot(path), taken[v])

def test_selfplay_in_processes_keeps_its_league_and_record_across_resume(tmp_path):
    # A scripted opponent kept in the league too: its games are reported apart from the snapshots'.
    cfg = count_game_config(2_500, **{"serial": False, "env.num_workers": 2, "selfplay.snapshot_every": 10,
                                      "selfplay.scripted_opponents": ["random"], "selfplay.scripted_prob": 0.3})
    train(cfg, run_dir=tmp_path, quiet=True)
    versions = check_league_run(tmp_path)
    scripted = [r for r in read_metrics(tmp_path) if r.get("league/scripted/random/games")]
    assert scripted and sum(r["league/scripted/random/games"] for r in scripted) < sum(
        r["league/games"] for r in read_metrics(tmp_path) if r.get("league/games"))  # 0.3 of the games
    for r in scripted:
        assert sum(r[f"league/scripted/random/{k}"] for k in ("win_rate", "draw_rate", "loss_rate")) == \
            pytest.approx(1.0)
    files = {v: read_snapshot(path) for v, path in saved_snapshots(tmp_path)}
    before = json.loads((league_dir(tmp_path) / "record.json").read_text())["results"]
    steps = read_metrics(tmp_path)[-1]["env_steps"]
    # Resumed with no snapshot due: the league plays on as it was, its results carried on.
    train(count_game_config(steps + 1_000, **{"serial": False, "env.num_workers": 2,
                                              "selfplay.snapshot_every": 100_000}),
          run_dir=tmp_path, resume=True, quiet=True)
    assert [v for v, _ in saved_snapshots(tmp_path)] == versions
    for v, path in saved_snapshots(tmp_path):
        np.testing.assert_array_equal(read_snapshot(path), files[v])
    after = json.loads((league_dir(tmp_path) / "record.json").read_text())["results"]
    assert set(after) == {str(v) for v in versions}
    # The runner's last report may precede the learner's last snapshot: results against one that
    # left the league since are not carried on.
    kept = [str(v) for v in versions if str(v) in before]
    assert kept and sum(map(sum, after.values())) > sum(sum(before[v]) for v in kept)
    for v in kept:
        assert all(now >= was for now, was in zip(after[v], before[v]))

def test_a_resume_restores_the_league_of_its_checkpoint_and_skips_a_bad_snapshot(tmp_path, monkeypatch, capsys):
    train(count_game_config(2_500), run_dir=tmp_path, quiet=True)
    _, state = load_latest_checkpoint(tmp_path)
    version = state["learner"]["version"]
    versions = [v for v, _ in saved_snapshots(tmp_path)]
    assert len(versions) == 3 and versions[-1] <= version
    # Written after the checkpoint (a kill before the next one): a snapshot, its results, a temporary file.
    newer = version + 3
    shutil.copy(snapshot_path(tmp_path, versions[-1]), snapshot_path(tmp_path, newer))
    record_path = league_dir(tmp_path) / "record.json"
    record = json.loads(record_path.read_text())
    record["results"][str(newer)] = [0, 0, 9]
    record.setdefault("recent", {})[str(newer)] = [-1] * 9
    record["ratings"][f"snapshot-{newer}"] = [30.0, 1.0]
    record_path.write_text(json.dumps(record))
    (league_dir(tmp_path) / f".snapshot-{newer:012d}.x1y2.tmp").write_bytes(b"half")
    snapshot_path(tmp_path, versions[1]).write_bytes(b"not a snapshot")  # corrupt
    restored, started = watch_league_starts(monkeypatch, lambda record: set(record.results) | set(record.recent))
    capsys.readouterr()
    train(count_game_config(3_000, **{"selfplay.snapshot_every": 100_000}), run_dir=tmp_path, resume=True,
          quiet=True)
    assert restored == [[versions[0], versions[2]]] and newer not in started[0]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "league snapshot" in line]
    assert len(warnings) == 1 and snapshot_path(tmp_path, versions[1]).name in warnings[0]
    names = league_files(tmp_path)
    assert snapshot_path(tmp_path, newer).name + ".bad" in names and snapshot_path(tmp_path, versions[1]).name + \
        ".bad" in names
    assert not [name for name in names if name.endswith(".tmp")]
