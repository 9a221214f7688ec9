"""Which keys shape a checkpoint's weights: what a resume or an evaluation may not change."""
from __future__ import annotations

from .loading import flat_config
from .schema import KEYS, Config

# Config keys a checkpoint's weights depend on: a resumed or evaluated run must keep them.
WEIGHTS_KEY_SECTIONS = ("model",)
INIT_ONLY_KEYS = ("model.core_memory_steps",)  # how new weights start: a resume or an evaluation may differ
WEIGHTS_KEYS = ("env.id", "env.kwargs", "env.actions", "env.frame_skip", "env.resize", "env.grayscale",
                "env.frame_stack", "env.image_keys", "learner.algo")


def weights_mismatch(saved: dict, cfg: Config, unread: tuple[str, ...] = ()) -> str:
    """``key: saved -> asked`` for every key that shapes the weights and differs between
    ``saved`` (a checkpoint's config, as Config.to_dict() wrote it) and ``cfg``; "" if none."""
    before, now = flat_config(saved), flat_config(cfg.to_dict())
    keys = [k for k in now if (k in WEIGHTS_KEYS or k.split(".")[0] in WEIGHTS_KEY_SECTIONS)
            and k not in INIT_ONLY_KEYS and k not in unread]
    # A key the saved config lacks was added since: that run had its default.
    before = {k: before.get(k, KEYS[k].default_when_saved) for k in keys}
    return ", ".join(f"{k}: {before[k]!r} -> {now[k]!r}" for k in keys if before[k] != now[k])
