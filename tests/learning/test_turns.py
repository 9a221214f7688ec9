"""connect4-selfplay's network fits tic-tac-toe's minimax values by plain regression: self-play's value
head is not short of capacity."""
import numpy as np
import torch

from fastrl.config import build_config
from fastrl.envs import probe_env
from fastrl.envs.spaces import MASK_KEY, ObsLayout
from fastrl.models.networks import build_model
from fastrl.multiagent.opponents import TIC_TAC_TOE_FULL, tic_tac_toe_lined, tic_tac_toe_value
from tests.unit.envs.test_turns import TIC_TAC_TOE


def test_the_value_head_can_learn_tic_tac_toes_minimax_values():
    # Every position with a move to make, from its mover's side, and its value under perfect
    # play: the targets self-play's value head should approach. The profile's network fits them
    # by plain regression, so a policy that does not learn the game is not short of capacity,
    # nor blind to the board as fastrl encodes it.
    positions, seen = [], set()

    def walk(mine, theirs):
        if (mine, theirs) in seen:
            return
        seen.add((mine, theirs))
        if tic_tac_toe_lined(theirs) or mine | theirs == TIC_TAC_TOE_FULL:
            return
        positions.append((mine, theirs))
        for square in range(9):
            if not (mine | theirs) >> square & 1:
                walk(theirs, mine | 1 << square)

    walk(0, 0)
    assert len(positions) == 4520
    squares = 1 << np.arange(9)
    mine, theirs = (np.array([p[k] for p in positions])[:, None] & squares != 0 for k in (0, 1))
    cfg = build_config("connect4-selfplay", {"env.id": TIC_TAC_TOE, "device": "cpu"})
    spec = probe_env(cfg)
    obs = ObsLayout(spec.observation_space).pack({
        "observation": np.stack([mine, theirs], -1).reshape(-1, 3, 3, 2).astype(np.int8),
        MASK_KEY: (~(mine | theirs)).astype(np.int8)}, len(positions))
    values = torch.tensor([tic_tac_toe_value(*p) for p in positions], dtype=torch.float32)
    torch.manual_seed(0)
    model = build_model(spec.observation_space, spec.action_space, cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        _, predicted = model(torch.as_tensor(obs))
        loss = (predicted - values).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert ((predicted.detach() - values).abs() < 0.5).float().mean() >= 0.97
