"""What a user can get wrong on the command line ends in one line that names the fix, and an exit
code: never a traceback. The commands run in-process on a run directory made by hand (config.toml
and a checkpoint of an untrained model), so no training is needed."""
import pytest
import torch

from fastrl.cli import eval_main, train_main
from fastrl.config import build_config, to_toml
from fastrl.envs import probe_env
from fastrl.evaluation import episodes as policy_eval
from fastrl.files.checkpoint import best_checkpoint_path, save_checkpoint, write_checkpoint_file
from fastrl.models.networks import build_model

COUNTDOWN = "fastrl.envs.toy:make_countdown"


def small_config(**overrides):
    settings = {"env.id": COUNTDOWN, "env.kwargs": {"length": 3}, "env.num_workers": 1, "env.envs_per_worker": 4,
                "env.num_splits": 1, "learner.rollout": 4, "learner.batch_size": 8, "device": "cpu",
                "model.kind": "mlp", "model.hidden_sizes": [8], "train_for_env_steps": 100}
    return build_config("cartpole-appo", {**settings, **overrides})


def untrained_state(cfg, env_steps=100) -> dict:
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    return {"learner": {"model": model.state_dict()}, "counters": {"env_steps": env_steps},
            "config": cfg.to_dict()}


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as fastrl-train leaves it: config.toml and one checkpoint at 100 env steps."""
    cfg = small_config()
    (tmp_path / "config.toml").write_text(to_toml(cfg))
    save_checkpoint(tmp_path, untrained_state(cfg), 100, keep=3)
    return tmp_path


def one_line_error(capsys, code, expected_code, prog, message):
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == expected_code and out == "", (code, out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{prog}: ") and message in lines[0], lines[0]


@pytest.mark.parametrize("args, message", [
    (["--device", "foo"], "--device must be auto, cpu, cuda or cuda:N, got 'foo'"),
    (["--video", ""], "--video needs a file path ending in .mp4, got an empty one"),
])
def test_eval_options_that_cannot_work_are_one_line(run_dir, capsys, args, message):
    one_line_error(capsys, eval_main([str(run_dir), *args]), 2, "fastrl-eval", message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs --device cuda")
def test_eval_on_cuda_without_cuda_says_to_use_the_cpu(run_dir, capsys):
    one_line_error(capsys, eval_main([str(run_dir), "--device", "cuda"]), 2, "fastrl-eval",
                   "--device cuda: torch sees no CUDA device; use --device cpu")


def test_a_gpu_index_beyond_the_visible_ones_is_one_line(run_dir, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    one_line_error(capsys, eval_main([str(run_dir), "--device", "cuda:3"]), 2, "fastrl-eval",
                   "--device cuda:3: 1 GPU(s) are visible (cuda:0 to cuda:0)")


def test_ctrl_c_during_evaluation_exits_130_with_one_line(run_dir, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(policy_eval, "evaluate_policy", interrupted)
    one_line_error(capsys, eval_main([str(run_dir)]), 130, "fastrl-eval", "interrupted; no result")


def test_best_weights_without_an_env_step_count_are_one_line(run_dir, capsys):
    state = untrained_state(small_config())
    del state["counters"]["env_steps"]
    write_checkpoint_file(best_checkpoint_path(run_dir), state)
    one_line_error(capsys, eval_main([str(run_dir), "--best"]), 2, "fastrl-eval",
                   "best.pt' has no env step count (counters.env_steps)")


PAINTED = "fastrl.envs.toy:make_painted_countdown"


@pytest.mark.parametrize("setting, edited, differs", [
    (f'id = "{COUNTDOWN}"', f'id = "{PAINTED}"', f"env.id: '{COUNTDOWN}' -> '{PAINTED}'"),
    ("length = 3", "length = 5", "env.kwargs: {'length': 3} -> {'length': 5}"),
])
@pytest.mark.parametrize("best", [False, True])
def test_eval_refuses_a_config_toml_that_differs_from_what_the_weights_were_trained_with(run_dir, capsys, setting,
                                                                                           edited, differs, best):
    # Envs of the same spaces: the weights would load, and play another env than they learned.
    write_checkpoint_file(best_checkpoint_path(run_dir), untrained_state(small_config()))
    assert eval_main([str(run_dir), "--episodes", "2", *(["--best"] if best else [])]) == 0
    assert '"env_steps": 100' in capsys.readouterr().out
    toml = run_dir / "config.toml"
    assert setting in toml.read_text()
    toml.write_text(toml.read_text().replace(setting, edited))
    one_line_error(capsys, eval_main([str(run_dir), *(["--best"] if best else [])]), 2, "fastrl-eval",
                   f"config.toml' differs from the config its checkpoints were trained with ({differs}; "
                   f"checkpoint -> config.toml)")


def test_a_config_toml_that_is_not_toml_names_the_file_and_line(run_dir, capsys):
    toml = run_dir / "config.toml"
    lines = toml.read_text().splitlines()
    lines[2] = "seed 0"
    toml.write_text("\n".join(lines))
    message = f"'{toml}' is not valid TOML: Expected '=' after a key in a key/value pair (at line 3"
    one_line_error(capsys, eval_main([str(run_dir)]), 2, "fastrl-eval", message)
    one_line_error(capsys, train_main(["--resume", "--run-dir", str(run_dir)]), 2, "fastrl-train", message)


@pytest.mark.parametrize("text, message", [
    (b"seed = 0\nlearner.lr 3\n", " is not valid TOML: Expected '=' after a key in a key/value pair (at line 2"),
    (b"seed = \xff\n", " is not valid TOML: 'utf-8' codec can't decode byte 0xff"),
    (b"seed = 0\n[learner]\nlrr = 1\n", ": unknown config key 'learner.lrr' (did you mean learner.lr,"),
])
def test_a_profile_file_that_cannot_be_read_names_the_file(tmp_path, capsys, text, message):
    profile = tmp_path / "mine.toml"
    profile.write_bytes(text)
    one_line_error(capsys, train_main(["--profile", str(profile), "--run-dir", str(tmp_path / "run")]), 2,
                   "fastrl-train", f"profile '{profile}'{message}")


@pytest.mark.parametrize("env_id, kwargs, message", [
    ("builtins:dict", "{}", "Env factory 'builtins:dict' returned dict, not a gymnasium.Env"),
    (COUNTDOWN, "{lenght = 3}", f"env.kwargs: '{COUNTDOWN}' takes no argument 'lenght'"),
])
def test_an_env_that_cannot_be_made_is_one_line(tmp_path, capsys, env_id, kwargs, message):
    args = ["--env", env_id, "--set", f"env.kwargs={kwargs}", "--run-dir", str(tmp_path / "run"),
            "--train-for-seconds", "1", "--serial"]
    one_line_error(capsys, train_main(args), 2, "fastrl-train", message)
