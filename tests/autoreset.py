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
