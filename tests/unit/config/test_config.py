import dataclasses

import pytest
import tomli_w

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from fastrl.config import (
    Config,
    ConfigError,
    available_profiles,
    build_config,
    load_profile,
    load_run_config,
    set_user_value,
    to_toml,
    validate,
)
from tests.support.repo import REPO
from tests.support.small_learners import dqn_config


def test_every_profile_loads_and_states_its_promise():
    names = available_profiles()
    assert {"cartpole-appo", "atari-appo", "atari-impala", "mujoco-appo"} <= set(names)
    readme = (REPO / "README.md").read_text()
    for name in names:
        expect = build_config(name).expect
        if not expect.stated:  # a profile not measured yet promises nothing, and its README row says so
            assert f"| `{name}` | no promise yet |" in readme
            continue
        assert expect.metric and bool(expect.budget_env_steps) != bool(expect.budget_seconds)
        assert expect.hardware or not expect.budget_seconds


@pytest.mark.parametrize("expect, message", [
    ({"expect.threshold": 5.0, "expect.budget_env_steps": 100}, "expect.metric is empty: name the metrics key"),
    ({"expect.metric": "m"}, "[expect] needs exactly one budget, budget_env_steps or budget_seconds, got 0 and 0.0"),
    ({"expect.metric": "m", "expect.budget_seconds": 60.0}, "say which hardware it holds on with expect.hardware"),
])
def test_a_promise_without_its_parts_is_one_line(expect, message):
    reset = {"expect.metric": "", "expect.threshold": 0.0, "expect.budget_seconds": 0.0, "expect.hardware": ""}
    assert not build_config("cartpole-appo", reset).expect.stated  # no promise at all is fine (a user's own profile)
    with pytest.raises(ConfigError) as info:
        build_config("cartpole-appo", {**reset, **expect})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_run_directory_that_holds_the_promise_as_a_line_still_loads(tmp_path):
    cfg = build_config("cartpole-appo", {"learner.lr": 1e-4})
    data = cfg.to_dict()
    del data["expect"]
    (tmp_path / "config.toml").write_text('expected = "episode_return_mean >= 475 within 60 s wall"\n'
                                          + tomli_w.dumps(data), encoding="utf-8")
    loaded = load_run_config(tmp_path)
    assert loaded.learner.lr == 1e-4 and not loaded.expect.stated


def test_a_run_directory_whose_promise_was_judged_on_its_last_reports_still_loads(tmp_path):
    data = build_config("cartpole-appo", {"learner.lr": 1e-4}).to_dict()
    del data["expect"]["final_stretch"]
    data["expect"]["final_reports"] = 3  # the key before expect.final_stretch
    (tmp_path / "config.toml").write_text(tomli_w.dumps(data), encoding="utf-8")
    loaded = load_run_config(tmp_path)
    assert loaded.learner.lr == 1e-4 and loaded.expect.threshold == 475 and loaded.expect.final_stretch == 0.1
    with pytest.raises(ConfigError, match="did you mean expect.final_stretch"):  # a profile is told
        build_config(str(tmp_path / "config.toml"))


def test_set_parses_by_declared_type():
    cfg = load_profile("cartpole-appo")
    set_user_value(cfg, "learner.lr", "1e-3")
    set_user_value(cfg, "env.num_workers", "3")
    set_user_value(cfg, "model.hidden_sizes", "[32, 16]")
    set_user_value(cfg, "model.normalize_obs", "true")
    set_user_value(cfg, "device", "cpu")
    set_user_value(cfg, "env.kwargs", "{max_episode_steps = 100}")
    assert cfg.learner.lr == 1e-3 and cfg.env.num_workers == 3
    assert cfg.model.hidden_sizes == [32, 16] and cfg.model.normalize_obs is True
    assert cfg.device == "cpu" and cfg.env.kwargs == {"max_episode_steps": 100}


@pytest.mark.parametrize("text", ['["first", "second"]', "[first, second]", "['first','second']"])
def test_set_takes_a_list_of_strings_quoted_as_toml_or_bare(text):
    cfg = load_profile("cartpole-appo")
    set_user_value(cfg, "policies.names", text)
    assert cfg.policies.names == ["first", "second"]
    set_user_value(cfg, "model.hidden_sizes", "64")  # one bare item is a list of one
    assert cfg.model.hidden_sizes == [64]


@pytest.mark.parametrize("key, value, message", [
    ("learner.lrr", "1", "did you mean learner.lr"),
    ("learner.lr", "fast", "expects float"),
    ("env.num_workers", "2.5", "expects int"),
    ("model.normalize_obs", "maybe", "expects bool"),
    ("nosection.key", "1", "unknown config key"),
])
def test_bad_keys_and_values_name_the_fix(key, value, message):
    cfg = load_profile("cartpole-appo")
    with pytest.raises(ConfigError, match=message):
        set_user_value(cfg, key, value)


@pytest.mark.parametrize("overrides, message", [
    ({"env.num_splits": 3}, "divisible by env.num_splits"),
    ({"learner.batch_size": 1000}, "multiple of learner.rollout"),
    ({"learner.batch_size": 32 * 100000}, "lower learner.batch_size"),
    ({"learner.algo": "ppo2"}, "must be one of appo, impala"),
    ({"device": "tpu"}, "auto, cpu, cuda"),
    ({"learner.gamma": 1.5}, r"\[0, 1\]"),
    ({"train_for_env_steps": 0, "train_for_seconds": 0}, "never end"),
    ({"inference.in_workers": True, "inference.compile": True}, "inference.compile=false"),
    ({"inference.in_workers": True, "inference.device": "cuda:0"}, "in_workers runs the policy eagerly on each"),
])
def test_impossible_combinations_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config("cartpole-appo", overrides)


@pytest.mark.parametrize("value", ["float16", "fp32", ""])
def test_precision_is_float32_bfloat16_or_auto(value):
    assert build_config("cartpole-appo", {"learner.precision": "bfloat16"}).learner.precision == "bfloat16"
    assert build_config("cartpole-appo", {"learner.precision": "auto"}).learner.precision == "auto"
    with pytest.raises(ConfigError, match=rf"^config key 'learner.precision' must be one of float32, bfloat16, "
                                          rf"auto, got '{value}'$"):
        build_config("cartpole-appo", {"learner.precision": value})


def test_bfloat16_is_refused_where_it_would_be_ignored():
    with pytest.raises(ConfigError, match=r"learner.precision=bfloat16 is for appo/impala/dqn; r2d2 trains in "
                                          r"float32: set learner.precision=float32 \(or auto\)$"):
        build_config("cartpole-r2d2", {"learner.precision": "bfloat16"})
    assert build_config("cartpole-dqn", {"learner.precision": "bfloat16"}).learner.precision == "bfloat16"
    # auto is accepted; the learner resolves it to float32 for r2d2 (tests/unit/learner/test_vtrace_learner.py)
    assert build_config("cartpole-r2d2", {"learner.precision": "auto"}).learner.precision == "auto"


@pytest.mark.parametrize("profile", ["cartpole-dqn", "cartpole-r2d2"])
def test_return_normalization_is_refused_where_it_would_be_ignored(profile):
    algo = profile.split("-")[1]
    with pytest.raises(ConfigError, match=rf"^learner.normalize_returns is for appo/impala; {algo} keeps rewards in "
                                          rf"its replay as they arrived: set learner.normalize_returns=false "
                                          rf"\(learner.reward_scale scales them\)$"):
        build_config(profile, {"learner.normalize_returns": True})
    assert build_config("cartpole-appo", {"learner.normalize_returns": True}).learner.normalize_returns


def test_a_separate_critic_is_refused_where_there_is_no_critic_of_its_own_to_give():
    assert build_config("mujoco-appo", {"model.separate_critic": True}).model.separate_critic
    with pytest.raises(ConfigError, match="^model.separate_critic is for learner.algo=appo or impala; dqn's"):
        build_config("cartpole-dqn", {"model.separate_critic": True})
    with pytest.raises(ConfigError, match="^model.separate_critic needs a feed-forward model; with model.core=lstm"):
        build_config("cartpole-appo", {"model.separate_critic": True, "model.core": "lstm"})


def test_inference_compile_is_opt_in_and_refused_in_serial_mode():
    assert not build_config("cartpole-appo").inference.compile
    assert build_config("cartpole-appo", {"inference.compile": True, "inference.in_workers": False}).inference.compile
    with pytest.raises(ConfigError, match="^inference.compile serves the inference process; serial mode runs the "
                                          "policy eagerly: set serial=false or inference.compile=false$"):
        build_config("cartpole-appo", {"inference.compile": True, "serial": True})


def test_unknown_profile_lists_close_matches():
    with pytest.raises(ConfigError, match="did you mean cartpole-appo"):
        load_profile("cartpol-appo")


def test_resolved_config_round_trips_through_toml():
    cfg = build_config("mujoco-appo", {"env.kwargs": {"max_episode_steps": 100}})
    data = tomllib.loads(to_toml(cfg))
    assert data["learner"]["lr"] == cfg.learner.lr
    assert data["model"]["hidden_sizes"] == cfg.model.hidden_sizes
    assert data["env"]["kwargs"] == {"max_episode_steps": 100}
    assert data["device"] == cfg.device


# --- every numeric key has a declared range; NaN and infinities never pass ------------------

NAN, INF = float("nan"), float("inf")
NON_FINITE = (NAN, INF, -INF)
# Finite values outside each key's range; every float key also gets NaN, inf and -inf.
BAD_FLOATS = {
    "train_for_seconds": [-1.0],
    "report_every_s": [0.0, -5.0, 1e10],
    "checkpoint_every_s": [0.0],
    "restart_window_s": [0.0, -1.0],
    "dist_timeout_s": [0.0, 1e20],  # beyond datetime.timedelta: the collective's setup would raise
    "learner.lr": [0.0, -1e-3],
    "learner.adam_eps": [0.0, -1e-8],
    "learner.gamma": [-0.01, 1.01],
    "learner.vtrace_lambda": [-0.5, 1.5],
    "learner.clip_rho": [0.0],
    "learner.clip_c": [-1.0],
    "learner.clip_pg_rho": [0.0],
    "learner.ppo_clip": [0.0, -0.2],
    "learner.value_coef": [-0.5],
    "learner.entropy_coef": [-0.01],
    "learner.max_grad_norm": [-1.0, 0.0],  # clip_grad_norm_ would flip or zero every gradient
    "learner.reward_clip": [-1.0],
    "learner.reward_scale": [0.0, -1.0],
    "learner.epsilon": [-0.1, 1.5],
    "learner.epsilon_alpha": [-1.0],
    "learner.epsilon_late": [-0.1, 1.5],
    "replay.alpha": [-0.6],
    "replay.beta": [-0.4],
    "replay.replay_ratio": [-1.0],
    "replay.vtrace_fraction": [1.0, 2.0],
}
BAD_INTS = {
    "seed": [-1, 2**32],  # numpy seeds are 32-bit: the learner process would crash
    "train_for_env_steps": [-1],
    "slots_per_env": [1, 0, 257],
    "keep_checkpoints": [0],
    "max_worker_restarts": [-1],
    "env.num_workers": [0, -2, 1025],
    "env.envs_per_worker": [0, 2**16 + 1],
    "env.num_splits": [0, 256, 512],  # 1024 envs divide evenly: only the range stops them
    "env.num_threads": [-1, 1025],
    # Sizes far beyond any run: each would be a MemoryError while the env is probed or the arena sized.
    "env.frame_stack": [0, 257, 1_000_000_000],
    "env.frame_skip": [0, 257],
    "env.resize": [[84, 8193], [6, 84]],
    "model.hidden_sizes": [[64, 0], [-1], [64, 65537]],
    "model.core_size": [0, 65537, 10**12],  # torch would try to allocate the weights
    "learner.rollout": [0, 2**16 + 1],
    "learner.batch_size": [0, 2**24 + 1],
    "model.core_layers": [0, 65],
    "learner.num_epochs": [0, 1001],
    "learner.num_minibatches": [0],
    "learner.max_policy_lag": [-1],
    "learner.max_consecutive_skips": [0],
    "learner.torch_threads": [0, 1025],
    "learner.target_update_every": [0],
    "replay.capacity": [0, 10**9 + 1],
    "replay.min_fill": [-1, 10**9 + 1],
    "replay.n_step": [0, 1001],
    "replay.frame_stack": [0, 257],
    "replay.threads": [0, 1025],
    "replay.batch_size": [0, 2**24 + 1],
    "replay.sequence_length": [0, 2**16 + 1],
    "eval.episodes": [0, 10**6 + 1],
    "eval.num_envs": [0, 2**16 + 1],
    "pbt.objective_episodes": [0, 10**6 + 1],
    "learner.epsilon_decay_steps": [-1, 10**12 + 1],
    "learner.epsilon_late_after_steps": [-1, 10**12 + 1],
}
DQN_KEYS = ("learner.epsilon", "learner.epsilon_alpha", "learner.target_update_every")
RANGES_OF = {"learner.epsilon": "in [0, 1]", "learner.epsilon_alpha": ">= 0", "learner.target_update_every": ">= 1"}
OUT_OF_RANGE = ([(key, value) for key, values in BAD_FLOATS.items() for value in (*NON_FINITE, *values)]
                + [(key, value) for key, values in BAD_INTS.items() for value in values])


@pytest.mark.parametrize("key, value", OUT_OF_RANGE, ids=[f"{k}={v!r}" for k, v in OUT_OF_RANGE])
def test_out_of_range_values_name_the_key_the_range_and_the_value(key, value):
    profile = "cartpole-dqn" if key in DQN_KEYS else "cartpole-appo"
    with pytest.raises(ConfigError) as info:
        build_config(profile, {key: value})
    message = str(info.value)
    assert f"config key '{key}' " in message and " must be " in message, message
    assert repr(value) in message and "\n" not in message, message


def test_a_size_beyond_any_run_is_one_line_before_the_env_is_made(tmp_path, capsys, monkeypatch):
    from fastrl.cli import train_main
    from fastrl.run import preflight

    monkeypatch.setattr(preflight, "probe_env", None)  # never reached
    code = train_main(["--env", "tests.support.image_envs:make_step_image_env", "--set", "env.frame_stack=1000000000",
                       "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err == ("fastrl-train: error: config key 'env.frame_stack' must be in [1, 256], got "
                                 "1000000000\n"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ["learner.epsilon", "learner.epsilon_alpha"])
@pytest.mark.parametrize("value", NON_FINITE)
def test_keys_an_algo_ignores_still_reject_non_finite_values(key, value):
    with pytest.raises(ConfigError, match=f"config key '{key}' must be"):
        build_config("cartpole-appo", {key: value})


@pytest.mark.parametrize("key, value", [("learner.epsilon", 1.5), ("learner.epsilon_alpha", -1.0),
                                        ("learner.target_update_every", 0)])
@pytest.mark.parametrize("profile", ["cartpole-dqn", "cartpole-r2d2"])
def test_keys_every_q_learner_reads_are_checked_under_each(profile, key, value):
    # r2d2's actors are epsilon-greedy by the same Ape-X schedule and its target network is copied
    # by the same rule as dqn's: its keys are in range for it too.
    with pytest.raises(ConfigError) as info:
        build_config(profile, {key: value})
    assert str(info.value) == f"config key '{key}' must be {RANGES_OF[key]}, got {value!r}"


@pytest.mark.parametrize("profile", ["cartpole-appo", "atari-impala"])
def test_keys_only_q_learners_read_take_any_finite_value_elsewhere(profile):
    cfg = build_config(profile, {"learner.epsilon": 1.5, "learner.epsilon_alpha": -1.0,
                                 "learner.target_update_every": 0})
    assert (cfg.learner.epsilon, cfg.learner.epsilon_alpha, cfg.learner.target_update_every) == (1.5, -1.0, 0)
    with pytest.raises(ConfigError, match=r"^config key 'learner.epsilon' must be finite, got nan$"):
        build_config(profile, {"learner.epsilon": NAN})


def test_a_section_built_by_hand_is_checked_by_the_same_rules():
    from fastrl.config import ReplayConfig, check_section

    check_section(ReplayConfig(), "replay")
    with pytest.raises(ConfigError, match=r"^config key 'replay.alpha' must be >= 0, got -1.0$"):
        check_section(ReplayConfig(alpha=-1.0), "replay")
    with pytest.raises(ConfigError, match=r"^config key 'replay.compress' must be one of , lz4, got 'gzip'$"):
        check_section(ReplayConfig(compress="gzip"), "replay")
    cfg = Config()
    cfg.replay.alpha = -1.0
    with pytest.raises(ConfigError, match=r"^config key 'replay.alpha' must be >= 0, got -1.0$"):
        validate(cfg)


def test_every_numeric_key_has_a_range():
    from fastrl.config import KEYS, RANGES

    cfg = Config()

    def default(key):
        section, _, name = key.rpartition(".")
        return getattr(getattr(cfg, section) if section else cfg, name)

    def is_number(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    numeric = [key for key in KEYS if is_number(default(key)) or KEYS[key].type in (list[int], list[float])]
    assert numeric and sorted(RANGES) == sorted(numeric)


def test_num_splits_fits_the_one_byte_request_ids_with_a_restart_tag():
    # A worker sends generation_tag * S + request in one byte (fastrl.ipc.slots): S <= 128 leaves
    # at least two tags, so a restarted worker tells its replies from its predecessor's.
    build_config("cartpole-appo", {"env.num_splits": 128})
    with pytest.raises(ConfigError, match=r"'env.num_splits' must be in \[1, 128\], got 256"):
        build_config("cartpole-appo", {"env.num_splits": 256})


# --- config.toml: written by a TOML library, so any config round-trips ---------------------

AWKWARD_KWARGS = [
    {"max_episode_steps": 100},
    {"a key with spaces": 1, "dotted.key": 2, 'quote"key': 3, "it's": 4, "": "empty key"},
    {"text": 'she said "hi"\\n', "newlines": "two\nlines\r\n", "controls": "\x00\x07\t\x1b\x7f"},
    {"unicode ключ ✓": "ünïcødé 🎮", "tab\tkey": "x"},
    {"injection": '"\n[learner]\nlr = 1.0\n# ', "x = 1": "]"},
    {"nested": {"inner table": {"deep.er": [1, 2.5, "s"]}, "empty": {}}, "list of tables": [{"a": 1}, {"b": "x"}]},
    {"floats": [1e-5, -0.0, 1e300, 5e-324, 0.1], "ints": [0, -1, 2**63 - 1], "lists": [[1, 2], [], ["a"]]},
    {"flags": [True, False], "flag": False},
]


def round_trip(cfg, tmp_path):
    (tmp_path / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
    return load_run_config(tmp_path)


@pytest.mark.parametrize("kwargs", AWKWARD_KWARGS)
def test_env_kwargs_round_trip_through_config_toml(kwargs, tmp_path):
    cfg = build_config("cartpole-appo",
                       {"env.kwargs": kwargs, "learner.lr": 1e-5, "expect.hardware": 'a "quoted"\nline'})
    assert round_trip(cfg, tmp_path) == cfg


@pytest.mark.parametrize("profile", available_profiles())
def test_every_profile_round_trips_through_config_toml(profile, tmp_path):
    cfg = build_config(profile)
    text = to_toml(cfg)
    assert round_trip(cfg, tmp_path) == cfg
    # Readable: top-level keys first, then one table per section, in order.
    headers = [text.index(f"\n[{section}]\n") for section in ("env", "model", "learner", "replay")]
    assert text.startswith("device = ") and text.index("\nseed = ") < headers[0] and headers == sorted(headers)


def test_a_value_toml_cannot_hold_is_a_config_error():
    cfg = build_config("cartpole-appo", {"env.kwargs": {"render_mode": "rgb_array"}})
    cfg.env.kwargs["render_mode"] = None  # research code may set any Python value
    with pytest.raises(ConfigError, match="env.kwargs"):
        to_toml(cfg)


# --- one declaration per key: validation, --list-keys and docs/config.md come from it ---------

def test_docs_config_md_is_current():

    from fastrl.config.reference import markdown

    page = REPO / "docs" / "config.md"
    assert page.read_text(encoding="utf-8") == markdown(), \
        "regenerate: python -m fastrl.config.reference > docs/config.md"


def test_docs_config_md_has_one_row_per_key_with_its_declaration():
    from fastrl.config import KEYS
    from fastrl.config.reference import markdown

    rows = {line.split(" | ")[0].strip("|` "): line for line in markdown().splitlines() if line.startswith("| `")}
    assert list(rows) == list(KEYS)
    assert rows["learner.epsilon"] == ("| `learner.epsilon` | `float` | `0.4` | in [0, 1]; appo, impala, sac: finite | "
                                       f"dqn, r2d2 | {KEYS['learner.epsilon'].help} |")
    assert ('| "auto", "mlp", "nature_cnn", "mnih2013_cnn", "convnet_simple", "impala_resnet", "board_cnn" | all |'
            in rows["model.kind"])
    assert "| `list[int]` | `[64, 64]` | in [1, 65536] | all |" in rows["model.hidden_sizes"]


def test_list_keys_prints_each_key_with_its_default_allowed_values_readers_and_help(capsys):
    from fastrl.cli import train_main
    from fastrl.config import KEYS

    assert train_main(["--list-keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" = ")[0] for line in lines] == list(KEYS)
    line = lines[list(KEYS).index("learner.target_update_every")]
    assert line.startswith("learner.target_update_every = 2500 ")
    assert line.endswith("# int; >= 1; appo, impala, sac: finite; read by dqn, r2d2. "
                         "gradient steps between target-network copies")


def test_every_key_is_declared_with_its_help_and_readers():
    from fastrl.config import ALGOS, KEYS, _declared_keys

    for name, declared in KEYS.items():
        assert declared.help and declared.algos and set(declared.algos) <= set(ALGOS), name

    @dataclasses.dataclass
    class Undeclared:
        width: int = 3

    with pytest.raises(TypeError, match=r"^Undeclared.width is not declared with fastrl.config.schema.declare\(\)$"):
        _declared_keys(Undeclared, "x.")


# The replay section.


@pytest.mark.parametrize("profile, overrides, message", [
    ("cartpole-appo", {"replay.vtrace_fraction": 1.0}, r"vtrace_fraction' must be in \[0, 1\)"),
    ("cartpole-appo", {"replay.vtrace_fraction": -0.1}, r"vtrace_fraction' must be in \[0, 1\)"),
    ("cartpole-dqn", {"replay.vtrace_fraction": 0.5}, "dqn replays every batch"),
    ("cartpole-dqn", {"replay.min_fill": 200_000}, r"min_fill \(200000\) exceeds the 99968 records replay.capacity"),
    ("cartpole-appo", {"replay.vtrace_fraction": 0.5, "replay.min_fill": 2_000_000}, "lower replay.min_fill"),
    ("cartpole-dqn", {"replay.capacity": 64 * 3, "replay.min_fill": 0}, "leaves 3 records per env for 64 envs"),
    ("cartpole-appo", {"replay.vtrace_fraction": 0.5, "replay.capacity": 2048 * 32, "replay.min_fill": 0},
     r"frame_stack \+ learner.rollout = 33"),
    ("cartpole-dqn", {"learner.epsilon": 1.5}, r"learner.epsilon' must be in \[0, 1\]"),
    ("cartpole-dqn", {"learner.target_update_every": 0}, "target_update_every' must be >= 1"),
    ("cartpole-dqn", {"replay.replay_ratio": 0.0}, "replay_ratio' must be > 0 for dqn"),
    ("cartpole-dqn", {"replay.compress": "zip"}, "replay.compress' must be one of"),
    ("cartpole-dqn", {"replay.n_step": 0}, r"replay.n_step' must be in \[1, 1000\]"),
    ("cartpole-dqn", {"replay.alpha": -1.0}, "replay.alpha' must be >= 0"),
    ("cartpole-appo", {"replay.checkpoint": True}, "learner.algo=appo keeps none unless replay.vtrace_fraction > 0: "
                                                   "set replay.checkpoint=false"),
])
def test_bad_replay_settings_name_the_fix(profile, overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(profile, overrides)


def test_min_fill_is_checked_against_the_capacity_the_replay_can_hold():
    with pytest.raises(ConfigError, match="min_fill"):
        dqn_config(**{"replay.capacity": 258, "replay.min_fill": 257})


def test_replay_settings_matter_only_where_a_replay_is_used():
    # appo without V-trace replay keeps no replay: its capacity and epsilon are not checked.
    build_config("cartpole-appo", {"replay.capacity": 1, "replay.min_fill": 5, "learner.epsilon": 1.5})


def test_replay_section_round_trips_through_toml(tmp_path):
    cfg = build_config("cartpole-dqn", {"replay.n_step": 5, "replay.compress": "lz4", "replay.replay_ratio": 0.5,
                                        "learner.target_update_every": 7, "learner.double_q": False})
    text = to_toml(cfg)
    assert "\n[replay]\n" in text and "replay_ratio = 0.5" in text
    (tmp_path / "config.toml").write_text(text)
    loaded = load_run_config(tmp_path)
    assert loaded == cfg
    assert loaded.replay.compress == "lz4" and loaded.learner.algo == "dqn" and not loaded.learner.double_q
