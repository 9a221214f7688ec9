"""The tests of tests/unit/tuning/test_pbt.py's subject that train in this process."""
import json

import pytest

from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from fastrl.run.plan import RunError
from fastrl.run.training import train
from tests.unit.learner.test_policy_set import assert_same_state, one_line, read_metrics
from tests.unit.tuning.test_pbt import run_config


def check_population_run(run_dir, members: int = 3):
    """The metrics report every member, the lineage names copies, the checkpoint holds every member
    and the exploit's state."""
    records = read_metrics(run_dir)
    for k in range(members):
        assert any(r[f"member/{k}/episodes_recent"] > 0 for r in records), k
        assert records[-1][f"member/{k}/learner/learner_updates"] > 0
        assert records[-1][f"member/{k}/episode_return_mean"] > 0
        assert any(r[f"member/{k}/learner/lr"] > 0 for r in records)  # lr_decay: 0 at the budget's end
        assert records[-1][f"member/{k}/learner/value_coef"] > 0
    assert not any(key.startswith("policy/") for key in records[-1])
    lineage = [json.loads(line) for line in (run_dir / "pbt" / "lineage.jsonl").read_text().splitlines()]
    assert lineage and all(line["env_steps"] >= 400 and line["member"] != line["copied"] for line in lineage)
    history = [json.loads(line) for line in (run_dir / "pbt" / "history.jsonl").read_text().splitlines()]
    assert len(history) >= 4 and history[0]["env_steps"] == 0
    state = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert list(state["policies"]) == [f"member_{k}" for k in range(members)]
    assert_same_state(state["learner"]["model"], state["policies"]["member_0"]["learner"]["model"])
    assert set(state["pbt"]) >= {"next_exploit", "rng", "start_values", "recent"}
    # The last history line's hyperparameters earned its objectives; its copiers' are in the lineage.
    latest = [m["hyperparameters"] for m in history[-1]["members"]]
    for line in lineage:
        if line["env_steps"] == history[-1]["env_steps"]:
            latest[line["member"]] = line["hyperparameters"]
    assert [state["policies"][f"member_{k}"]["hyperparameters"] for k in range(members)] == latest
    return state, lineage

def test_a_population_trains_reports_members_and_resumes_whole(tmp_path):
    cfg = run_config()
    train(cfg, run_dir=tmp_path, quiet=True)
    before, lineage = check_population_run(tmp_path)
    start = [{"learner.lr": lr} for lr in (1e-5, 1e-3, 3e-3)]
    assert any(before["policies"][f"member_{k}"]["hyperparameters"]["learner.lr"] != start[k]["learner.lr"]
               for k in range(3))  # the restore below has explored values to restore
    assert before["pbt"]["recent"] != [[], [], []]
    # Another population size is refused in one line, naming the setting that resumes it.
    saved = list_checkpoints(tmp_path)
    with pytest.raises(RunError) as error:
        train(run_config(**{"pbt.population": 2, "pbt.start.learner.lr": [1e-5, 1e-3]}), run_dir=tmp_path,
              resume=True, quiet=True)
    assert "trained a population of 3 members (this run has a population of 2 members); resume it with " \
           "pbt.population=3, or start a new run" in one_line(error)
    assert "policies" not in str(error.value) and list_checkpoints(tmp_path) == saved
    # Resumed at its budget, the run trains nothing: its last checkpoint is the state it restored.
    train(cfg, run_dir=tmp_path, resume=True, quiet=True)
    restored = load_checkpoint(list_checkpoints(tmp_path)[-1])
    for k in range(3):
        name = f"member_{k}"
        assert_same_state(before["policies"][name], restored["policies"][name], name)  # weights, Adam, hyperparameters
    assert restored["pbt"] == before["pbt"]  # next exploit, random state, start values, recent returns
    # Resumed further, the population goes on from there: exploits and copies continue.
    train(run_config(train_for_env_steps=5_000), run_dir=tmp_path, resume=True, quiet=True)
    after, more = check_population_run(tmp_path)
    assert after["pbt"]["next_exploit"] > before["pbt"]["next_exploit"]
    assert more[:len(lineage)] == lineage and len(more) > len(lineage)
    for k in range(3):
        member = f"member_{k}"
        assert after["policies"][member]["learner"]["updates"] > before["policies"][member]["learner"]["updates"]

def test_a_population_trains_and_resumes_in_processes(tmp_path):
    cfg = run_config(serial=False, **{"env.num_workers": 2})
    train(cfg, run_dir=tmp_path, quiet=True)
    before, lineage = check_population_run(tmp_path)
    train(run_config(serial=False, train_for_env_steps=5_000, **{"env.num_workers": 2}), run_dir=tmp_path,
          resume=True, quiet=True)
    after, more = check_population_run(tmp_path)
    assert more[:len(lineage)] == lineage
    for k in range(3):
        member = f"member_{k}"
        assert after["policies"][member]["learner"]["updates"] > before["policies"][member]["learner"]["updates"]
