"""How a Dict observation's image features meet its other leaves (model.image_trunk)."""


from fastrl.config import build_config, to_toml, weights_mismatch
from fastrl.envs import probe_env
from fastrl.models.networks import build_model, keys_it_ignores


def without_the_key(cfg) -> tuple[str, dict]:
    """``cfg`` as a run saved before model.image_trunk wrote it: config.toml's text, the checkpoint's dict."""
    saved = cfg.to_dict()
    del saved["model"]["image_trunk"]
    return "\n".join(line for line in to_toml(cfg).splitlines() if not line.startswith("image_trunk")), saved


def test_the_key_is_not_compared_where_it_shaped_nothing():
    cfg = build_config("cartpole-appo")  # vector observations: no CNN
    spec = probe_env(cfg)
    model = build_model(spec.observation_space, spec.action_space, cfg.model, algo=cfg.learner.algo)
    _, saved = without_the_key(cfg)
    assert keys_it_ignores(model) == ("model.image_trunk",)
    assert weights_mismatch(saved, cfg, keys_it_ignores(model)) == ""
