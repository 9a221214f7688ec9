"""Composite spaces (fastrl.envs.spaces, fastrl.models.heads, the leaf encoders, action masks): packed rows
round-trip exactly, unsupported spaces and broken masks fail in one clear line, factorized heads
agree with torch.distributions part by part, images read the same in HWC and CHW, each leaf
reaches its encoder, no masked action is ever sampled, every space kind trains end to end on
the toy envs (fastrl.envs.toy), and APPO solves the Dict-observation grid world."""

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import distributions as D

from fastrl.config import ModelConfig, build_config
from fastrl.envs import make_vec_env
from fastrl.envs.spaces import ActionLayout, ObsLayout, UnsupportedSpace
from fastrl.envs.toy import DictGridEnv, MaskedCueEnv, MatchComponentsEnv
from fastrl.models.encoders import SmallCNN, image_encoder
from fastrl.models.heads import (
    MASKED_LOGIT,
    BernoulliHead,
    CategoricalHead,
    FactorizedHead,
    action_head,
    bounded_log_std,
)
from fastrl.models.networks import ActorCritic, DuelingQNetwork
from fastrl.sampling.batcher import epsilon_greedy

TOY = "fastrl.envs.toy:"
FAULT = "tests.support.fault_envs:"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # The serial runs train in this process: tiny batches on two threads measured 2-5x slower on
    # the shared 2-core machine (as the learner and batcher processes do, one thread).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- observation rows


def nested_space():
    return spaces.Dict({
        "image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
        "inner": spaces.Tuple((
            spaces.Discrete(5),
            spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
            spaces.Dict({"flags": spaces.MultiBinary(3), "counts": spaces.Box(-9, 9, (2,), np.int16)}),
        )),
        "keys": spaces.MultiDiscrete([3, 4]),
    })


def test_obs_layout_packs_nested_dict_and_tuple_rows_that_unpack_exactly():
    layout = ObsLayout(nested_space())
    B = 4
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (B, 7, 7, 3)).astype(np.uint8)
    discrete = np.array([0, 4, 2, 3])
    floats = rng.normal(size=(B, 2, 3)) * 1e3  # float64: stored as float32
    flags = rng.integers(0, 2, (B, 3)).astype(np.int8)
    counts = rng.integers(-9, 10, (B, 2)).astype(np.int16)
    keys = np.array([[0, 3], [2, 1], [1, 0], [2, 3]])
    obs = {"image": image, "inner": (discrete, floats, {"flags": flags, "counts": counts}), "keys": keys}

    rows = layout.pack(obs, B)
    assert layout.packed and rows.dtype == np.uint8 and rows.shape == (B, layout.row_bytes)
    assert layout.storage_shape == (layout.row_bytes,) and layout.storage_dtype == np.uint8
    # gymnasium sorts a Dict's keys.
    assert [leaf.name for leaf in layout.leaves] == [
        "image", "inner.0", "inner.1", "inner.2.counts", "inner.2.flags", "keys[0]", "keys[1]"]
    assert all(leaf.offset % 8 == 0 for leaf in layout.leaves)
    assert layout.mask is None

    leaves = layout.unpack(torch.from_numpy(rows))
    want = {"image": (torch.uint8, image), "inner.0": (torch.int32, discrete),
            "inner.1": (torch.float32, floats.astype(np.float32)), "inner.2.flags": (torch.uint8, flags),
            "inner.2.counts": (torch.int32, counts), "keys[0]": (torch.int32, keys[:, 0]),
            "keys[1]": (torch.int32, keys[:, 1])}
    assert set(leaves) == set(want)
    for name, (dtype, values) in want.items():
        assert leaves[name].dtype == dtype, name
        np.testing.assert_array_equal(leaves[name].numpy(), values, err_msg=name)
    # The learner unpacks [T, B, row] blocks: the leading axes are kept.
    block = layout.unpack(torch.from_numpy(np.stack([rows, rows[::-1]])))
    assert block["image"].shape == (2, B, 7, 7, 3) and block["inner.1"].shape == (2, B, 2, 3)
    np.testing.assert_array_equal(block["inner.2.counts"][1].numpy(), counts[::-1])


def test_a_plain_box_is_stored_as_it_comes():
    space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    layout = ObsLayout(space)
    obs = np.zeros((2, 4, 84, 84), np.uint8)
    assert not layout.packed and layout.storage_shape == (4, 84, 84) and layout.storage_dtype == np.uint8
    assert layout.pack(obs, 2) is obs


def test_action_mask_leaf_and_discrete_observations():
    layout = ObsLayout(DictGridEnv().observation_space)
    assert layout.mask is not None and layout.mask.name == "action_mask" and layout.mask.kind == "mask"
    kinds = {leaf.name: (leaf.kind, leaf.size) for leaf in layout.leaves}
    assert kinds == {"image": ("image", 0), "position": ("discrete", 25), "action_mask": ("mask", 0)}
    discrete = ObsLayout(spaces.Discrete(7))
    rows = discrete.pack(np.array([6, 0, 3]), 3)
    assert discrete.unpack(torch.from_numpy(rows))["obs"].tolist() == [6, 0, 3]


# ---------------------------------------------------------------- unsupported spaces, broken masks


@pytest.mark.parametrize("nested", [False, True], ids=["top", "nested"])
@pytest.mark.parametrize("kind, name", [("text", "Text"), ("graph", "Graph"), ("sequence", "Sequence")])
def test_unsupported_observation_space_is_one_line_naming_it_and_its_key_path(kind, name, nested):
    with pytest.raises(UnsupportedSpace) as info:
        make_vec_env(FAULT + "make_unsupported_space", num_envs=2, batch_size=2, seed=0,
                     env_kwargs={"kind": kind, "nested": nested})
    message = str(info.value)
    assert "\n" not in message
    assert f"observation space {name}" in message and "make_unsupported_space" in message
    assert ("at key path 'inner.items'" in message) == nested


@pytest.mark.parametrize("space", [spaces.Dict({"a": spaces.Discrete(2)}), spaces.Text(4),
                                   spaces.Tuple((spaces.Discrete(2), spaces.Text(3)))])
def test_unsupported_action_space_is_refused(space):
    with pytest.raises(UnsupportedSpace, match="action space"):
        action_head(space)


def test_action_mask_of_the_wrong_shape_is_a_clear_error():
    with pytest.raises(UnsupportedSpace) as info:
        make_vec_env(TOY + "make_masked_cue", num_envs=2, batch_size=2, seed=0, env_kwargs={"mask_size": 5})
    assert "action_mask has shape (5,)" in str(info.value) and "Discrete(6) has 6 choices" in str(info.value)
    # A mask over a Box part has nothing to mask.
    obs = spaces.Dict({"x": spaces.Box(-1, 1, (2,)), "action_mask": spaces.MultiBinary(3)})
    with pytest.raises(UnsupportedSpace, match="needs Discrete or MultiDiscrete actions"):
        ActorCritic(obs, spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (1,)))))


def masked_rows(space: spaces.Dict, masks: np.ndarray, rng) -> np.ndarray:
    """Packed rows of ``space`` (Discrete / MultiDiscrete leaves and an action_mask): random
    values, these masks ``[B, flags]``."""
    rows = len(masks)
    obs = {key: rng.integers(sub.nvec, size=(rows, len(sub.nvec))) if isinstance(sub, spaces.MultiDiscrete)
           else rng.integers(sub.n, size=rows) for key, sub in space.spaces.items() if key != "action_mask"}
    return ObsLayout(space).pack(dict(obs, action_mask=masks), rows)


def random_masks(rng, rows: int, nvec) -> np.ndarray:
    """``[rows, sum(nvec)]`` uint8: each flag set with probability 1/2, at least one per component."""
    parts = []
    for n in nvec:
        legal = rng.random((rows, n)) < 0.5
        legal[np.arange(rows), rng.integers(n, size=rows)] = True
        parts.append(legal)
    return np.concatenate(parts, axis=1).astype(np.uint8)


@pytest.mark.parametrize("env", [MaskedCueEnv(), MatchComponentsEnv(masked=True)], ids=["discrete", "multidiscrete"])
def test_a_step_whose_mask_allows_nothing_raises_unless_it_ends_an_episode(env):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = ActorCritic(env.observation_space, env.action_space)
    nvec = [p.n for p in ActionLayout(env.action_space).parts]
    masks = random_masks(rng, 5, nvec)
    model.check_mask(torch.from_numpy(masked_rows(env.observation_space, masks, rng)))  # all legal somewhere
    masks[3, -nvec[-1]:] = 0  # the last component of step 3 has no legal value
    obs = torch.from_numpy(masked_rows(env.observation_space, masks, rng))
    with pytest.raises(ValueError, match="action_mask allows no action"):
        model.check_mask(obs)
    # On an episode's final observation the action is discarded: an empty mask is fine there,
    # and that component is left unmasked rather than all -inf.
    final = torch.tensor([False, False, False, True, False])
    model.check_mask(obs, final)
    params, _ = model(obs)
    assert (params[3, -nvec[-1]:] > MASKED_LOGIT).all() and torch.isfinite(params[3]).all()


# ---------------------------------------------------------------- heads


def reference_log_prob_and_entropy(layout: ActionLayout, params, actions):
    """Sum over the parts of torch.distributions' log-probs and entropies."""
    logp, entropy = 0.0, 0.0
    for part in layout.parts:
        p, a = params[:, part.param_slice], actions[:, part.action_slice]
        if part.kind == "categorical":
            dist, a = D.Categorical(logits=p), a[:, 0].long()
        elif part.kind == "gaussian":
            mean, raw = p.chunk(2, dim=-1)
            dist = D.Independent(D.Normal(mean, bounded_log_std(raw).exp()), 1)
        else:
            dist = D.Independent(D.Bernoulli(logits=p), 1)
            a = a.to(p.dtype)
        logp, entropy = logp + dist.log_prob(a), entropy + dist.entropy()
    return logp, entropy


@pytest.mark.parametrize("space", [
    spaces.MultiDiscrete([3, 4, 2]),
    spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32))),
    spaces.Tuple((spaces.Discrete(4), spaces.Box(-1, 1, (1,), np.float32), spaces.MultiBinary(3),
                  spaces.MultiDiscrete([2, 5]))),
], ids=["multidiscrete", "tuple-discrete-box", "tuple-of-four"])
def test_factorized_log_prob_and_entropy_are_the_sums_of_their_parts(space):
    torch.manual_seed(0)
    layout = ActionLayout(space)
    head = action_head(space)
    assert isinstance(head, FactorizedHead)
    params = 2.0 * torch.randn(4096, layout.num_params, dtype=torch.float64)
    actions, logp = head.sample_with_log_prob(params)
    assert actions.shape == (4096, *layout.shape)
    assert actions.dtype == (torch.int64 if isinstance(space, spaces.MultiDiscrete) else torch.float32)
    want_logp, want_entropy = reference_log_prob_and_entropy(layout, params, actions)
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(head.log_prob(params, actions), want_logp)
    torch.testing.assert_close(head.entropy(params), want_entropy)
    if isinstance(space, spaces.Tuple):  # the env gets each part as its space declares it
        for value, sub in zip(layout.to_env(actions.numpy()), space.spaces):
            assert all(sub.contains(v) for v in value[:50]), sub


def test_bernoulli_head_matches_torch_distributions():
    torch.manual_seed(0)
    params = 3.0 * torch.randn(20_000, 5, dtype=torch.float64)
    head = BernoulliHead()
    actions, logp = head.sample_with_log_prob(params)
    assert actions.dtype == torch.int64 and set(actions.unique().tolist()) <= {0, 1}
    dist = D.Independent(D.Bernoulli(logits=params), 1)
    torch.testing.assert_close(logp, dist.log_prob(actions.double()))
    torch.testing.assert_close(head.entropy(params), dist.entropy())
    # Each bit is 1 with probability sigmoid(logit): the empirical rate over all bits is close.
    expected = torch.sigmoid(params).mean()
    assert abs(float(actions.double().mean() - expected)) < 0.01
    torch.testing.assert_close(head.sample(params, deterministic=True), (params > 0).long())


# ---------------------------------------------------------------- encoders


@pytest.mark.parametrize("hwc, chw", [((9, 9, 3), (3, 9, 9)), ((40, 40, 4), (4, 40, 40))], ids=["small", "nature"])
def test_images_in_hwc_and_chw_give_the_same_features(hwc, chw):
    torch.manual_seed(0)
    channels_last, channels_first = image_encoder(hwc), image_encoder(chw)
    assert type(channels_last) is type(channels_first) and channels_last.channels_last
    assert not channels_first.channels_last
    channels_first.load_state_dict(channels_last.state_dict())
    x = torch.rand(6, *hwc)
    torch.testing.assert_close(channels_last(x), channels_first(x.permute(0, 3, 1, 2).contiguous()))


def test_model_kind_picks_the_atari_encoder_and_refuses_small_images():
    """nature_cnn, mnih2013_cnn (the CPU Atari profile's) and convnet_simple (Sample Factory's
    ViZDoom encoder) on an 84x84x4 stack: the published layer shapes (Mnih et al. 2015 and 2013,
    Sample Factory 2's convnet_simple), ELU in the last; images under 36 px get a one-line error."""
    box = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    shapes = {}
    for kind in ("nature_cnn", "mnih2013_cnn", "convnet_simple"):
        model = ActorCritic(box, spaces.Discrete(6), ModelConfig(kind=kind))
        shapes[kind] = [tuple(m.weight.shape) for m in model.encoder.modules()
                        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        params, value = model(torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8))
        assert params.shape == (3, 6) and value.shape == (3,)
    assert shapes["nature_cnn"] == [(32, 4, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3), (512, 3136)]
    assert shapes["mnih2013_cnn"] == [(16, 4, 8, 8), (32, 16, 4, 4), (256, 2592)]
    assert shapes["convnet_simple"] == [(32, 4, 8, 8), (64, 32, 4, 4), (128, 64, 3, 3), (512, 2048)]
    simple = ActorCritic(box, spaces.Discrete(6), ModelConfig(kind="convnet_simple"))
    activations = {type(m) for m in simple.encoder.modules()}
    assert torch.nn.ELU in activations and torch.nn.ReLU not in activations
    with pytest.raises(ValueError, match="model.kind=mnih2013_cnn needs images of at least 36 px"):
        image_encoder((4, 20, 20), "mnih2013_cnn")
    with pytest.raises(ValueError, match="'model.kind' must be one of"):
        build_config("atari-appo-cpu", {"model.kind": "mnih2014_cnn"})


def test_each_dict_leaf_reaches_its_encoder():
    torch.manual_seed(0)
    env = DictGridEnv()
    model = ActorCritic(env.observation_space, env.action_space, ModelConfig(kind="auto", hidden_sizes=[32]))
    encoder = model.encoder
    assert len(encoder.images) == 1
    cnn = next(iter(encoder.images.values()))
    assert isinstance(cnn, SmallCNN)
    assert encoder.trunk.net[1].in_features == cnn.out_features + 25  # CNN + one-hot, no mask

    seen = {}
    cnn.register_forward_hook(lambda m, args, out: seen.update(cnn_in=args[0], cnn_out=out))
    encoder.trunk.register_forward_pre_hook(lambda m, args: seen.update(trunk_in=args[0]))
    obs, _ = env.reset(seed=0)
    batch = {key: np.stack([value] * 3) for key, value in obs.items()}
    batch["position"] = np.array([0, 7, 24])
    batch["action_mask"][:] = 1
    layout = ObsLayout(env.observation_space)

    def run(b):
        with torch.no_grad():
            params, _ = model(torch.from_numpy(layout.pack(b, 3)))
        return {key: value.clone() for key, value in seen.items()}, params

    base, base_params = run(batch)
    # The image reaches the CNN scaled to [0, 1], HWC as stored (the CNN permutes it).
    torch.testing.assert_close(base["cnn_in"], torch.from_numpy(batch["image"]).float() / 255)
    width = base["cnn_out"].shape[1]
    torch.testing.assert_close(base["trunk_in"][:, :width], base["cnn_out"])
    # The Discrete leaf is one-hot.
    torch.testing.assert_close(base["trunk_in"][:, width:], torch.eye(25)[[0, 7, 24]])

    # Another position (rows 0 and 2) changes only that row's one-hot, not the image path.
    after, _ = run(dict(batch, position=np.array([1, 7, 3])))
    torch.testing.assert_close(after["cnn_out"], base["cnn_out"])
    changed = (after["trunk_in"] != base["trunk_in"]).any(-1)
    assert changed.tolist() == [True, False, True]
    # Another image (row 1) changes only that row's CNN features, not the one-hot.
    image = batch["image"].copy()
    row, column = np.argwhere(image[1, ..., 1] == 0)[0]
    image[1, row, column, 1] = 255
    after, _ = run(dict(batch, image=image))
    assert (after["cnn_out"] != base["cnn_out"]).any(-1).tolist() == [False, True, False]
    torch.testing.assert_close(after["trunk_in"][:, width:], base["trunk_in"][:, width:])
    # The mask is not an input: it changes the logits only, to MASKED_LOGIT where it is 0.
    masks = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 1]], np.uint8)
    after, params = run(dict(batch, action_mask=masks))
    torch.testing.assert_close(after["trunk_in"], base["trunk_in"])
    assert torch.equal(params == MASKED_LOGIT, torch.from_numpy(masks == 0))
    torch.testing.assert_close(params[masks == 1], base_params[masks == 1])


# ---------------------------------------------------------------- no masked action, ever

ROWS = 100_000


def outputs_on_masks(model: torch.nn.Module, masks: np.ndarray, rng) -> torch.Tensor:
    """The model's params (Q-values) ``[B, P]`` on random observations with ``masks``, its
    policy (advantage) bias set to +30 for even actions and -30 for odd ones: with random masks
    most rows have a favoured action masked, and only the mask keeps the sampler off it."""
    with torch.no_grad():
        n = model.policy.bias.numel()
        model.policy.bias.copy_(torch.where(torch.arange(n) % 2 == 0, 30.0, -30.0))
        return model(torch.from_numpy(masked_rows(model.observation_space, masks, rng)))[0]


def test_appo_sampling_never_takes_a_masked_action():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    env = MaskedCueEnv(num_actions=6)
    masks = random_masks(rng, ROWS, [6])
    masks[: ROWS // 10] = 0
    masks[: ROWS // 10, 1] = 1  # a tenth of the rows: one legal action, the one the policy dislikes
    params = outputs_on_masks(ActorCritic(env.observation_space, env.action_space), masks, rng)
    head = action_head(env.action_space)
    assert isinstance(head, CategoricalHead)
    fast_actions, fast_logp = head.sample_with_log_prob(params)  # the batcher's numba sampler on a CPU
    gumbel_actions = head.sample(params)  # the torch path (GPU, or other shapes)
    for actions in (fast_actions, gumbel_actions):
        assert masks[np.arange(ROWS), actions.numpy()].all()
    assert (fast_actions[: ROWS // 10] == 1).all()
    assert torch.isfinite(fast_logp).all() and (fast_logp[: ROWS // 10] == 0).all()
    torch.testing.assert_close(fast_logp, head.log_prob(params, fast_actions))
    # Every legal action is still taken: masking removed only the illegal ones.
    assert len(np.unique(fast_actions.numpy())) == 6


def test_multidiscrete_sampling_never_takes_a_masked_component_value():
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    env = MatchComponentsEnv(nvec=(3, 4, 2), masked=True)
    masks = random_masks(rng, ROWS, env.nvec)
    params = outputs_on_masks(ActorCritic(env.observation_space, env.action_space), masks, rng)
    actions, logp = action_head(env.action_space).sample_with_log_prob(params)
    first_flag = np.array([0, 3, 3 + 4])  # of each component in the mask
    assert masks[np.arange(ROWS)[:, None], first_flag + actions.numpy()].all()
    assert torch.isfinite(logp).all()


def test_dqn_epsilon_greedy_never_takes_a_masked_action():
    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    env = MaskedCueEnv(num_actions=6)
    masks = random_masks(rng, ROWS, [6])
    q = outputs_on_masks(DuelingQNetwork(env.observation_space, env.action_space), masks, rng)
    assert torch.equal(q == MASKED_LOGIT, torch.from_numpy(masks == 0))
    epsilons = torch.full((ROWS,), 0.9)
    actions, logp = epsilon_greedy(q, epsilons)
    assert masks[np.arange(ROWS), actions.numpy()].all()
    # Behaviour probabilities: epsilon spread over the legal actions, the rest on the greedy one.
    num_legal = torch.from_numpy(masks.sum(1)).float()
    greedy = actions == q.argmax(-1)
    torch.testing.assert_close(logp.exp(), 0.9 / num_legal + 0.1 * greedy)
    greedy_actions, _ = epsilon_greedy(q, torch.zeros(ROWS))
    assert masks[np.arange(ROWS), greedy_actions.numpy()].all()


# ---------------------------------------------------------------- end to end


def test_placeholder_box_bounds_never_clip_actions():
    # envpool declares ViZDoom's and DeepMind Control's actions as [2.2e-308, 1.8e308]: "no bounds".
    from fastrl.envs.spaces import box_bounds

    placeholder = spaces.Box(np.finfo(np.float64).tiny, np.finfo(np.float64).max, (3,), np.float64)
    low, high = box_bounds(placeholder)
    assert np.all(low == -np.inf) and np.all(high == np.inf)
    real = spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), dtype=np.float32)
    np.testing.assert_array_equal(box_bounds(real)[0], [-1.0, 0.0])
    # What every env backend sends (VecEnv._env_actions).
    np.testing.assert_array_equal(ActionLayout(placeholder).to_env(np.array([[-0.5, 0.0, 3.0]])), [[-0.5, 0.0, 3.0]])
    np.testing.assert_array_equal(ActionLayout(real).to_env(np.array([[-3.0, 5.0]], np.float32)), [[-1.0, 2.0]])


def test_packed_float_leaves_are_normalized_by_the_models_statistics_before_encoding():
    from fastrl.envs.spaces import ObsLayout
    from fastrl.models.networks import build_model

    space = spaces.Dict({"position": spaces.Box(-100, 100, (3,), np.float32), "room": spaces.Discrete(4)})
    model = build_model(space, spaces.Discrete(2), ModelConfig(normalize_obs=True), algo="appo")
    layout = ObsLayout(space)
    rng = np.random.default_rng(0)
    samples = [{"position": (5 + 2 * rng.standard_normal(3)).astype(np.float32), "room": int(rng.integers(4))}
               for _ in range(4000)]
    rows = torch.as_tensor(layout.pack({k: np.stack([s[k] for s in samples]) for k in ("position", "room")},
                                       len(samples)))
    model.normalizer.update(rows)
    leaves = model.encoder.leaf_inputs(rows)
    normalized = model.normalizer(leaves)["position"]
    assert abs(float(normalized.mean())) < 0.05 and abs(float(normalized.std()) - 1) < 0.05
    torch.testing.assert_close(model.encode(rows), model.encoder.encode_leaves(model.normalizer(leaves)))
    # The model owns the statistics once: they are saved under one name.
    assert [k for k in model.state_dict() if "stats" in k and k.endswith("mean")] == ["normalizer.stats.leaf0.mean"]
