"""Random episode flags under next-step autoreset (gymnasium 1.x, envpool), for kernel tests."""
import numpy as np


def autoreset_flags(rng, num_steps, batch, p_done=0.25):
    """``terminated``, ``truncated``, ``valid``: ``[T, B]`` bool, as a rollout worker records them.

    Each column is one env: a step ends its episode with probability ``p_done``, by termination
    or truncation with equal odds, and the step after a done is the autoreset step (invalid, no
    flags). A column may start on an autoreset step, as when the window before ended in a done.
    """
    terminated = np.zeros((num_steps, batch), bool)
    truncated = np.zeros((num_steps, batch), bool)
    valid = np.ones((num_steps, batch), bool)
    for b in range(batch):
        previous_done = rng.random() < p_done
        for t in range(num_steps):
            valid[t, b] = not previous_done
            done = valid[t, b] and rng.random() < p_done
            if done and rng.random() < 0.5:
                terminated[t, b] = True
            elif done:
                truncated[t, b] = True
            previous_done = done
    return terminated, truncated, valid


def nstep_episodes_reference(rewards, terminated, truncated, valid, gamma, n):
    """n-step targets walking each env's episodes: the window from a valid step t takes up to n
    steps of t's own episode inside the ``[T, B]`` window, up to and including the step that
    terminates it (bootstrap discount 0) or truncates it (bootstrap from the final observation
    at the next index). The autoreset step after a done belongs to no episode: its window is
    empty (return 0, bootstrap discount 1, bootstrap index t)."""
    num_steps, batch = rewards.shape
    returns = np.zeros((num_steps, batch))
    bootstrap_discounts = np.ones((num_steps, batch))
    bootstrap_indices = np.zeros((num_steps, batch), dtype=np.int64)
    for b in range(batch):
        for t in range(num_steps):
            m = 0
            while valid[t, b] and m < n and t + m < num_steps:
                returns[t, b] += bootstrap_discounts[t, b] * rewards[t + m, b]
                bootstrap_discounts[t, b] *= 0.0 if terminated[t + m, b] else gamma
                m += 1
                if terminated[t + m - 1, b] or truncated[t + m - 1, b]:
                    break
            bootstrap_indices[t, b] = t + m
    return returns, bootstrap_discounts, bootstrap_indices
