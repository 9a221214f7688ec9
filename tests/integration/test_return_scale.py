"""The tests of tests/unit/learner/test_return_scale.py's subject that train in this process."""
import numpy as np
import pytest
import torch

from fastrl.config import build_config
from tests.unit.learner.test_return_scale import (
    brute_force_returns,
    learner_batch,
    normalizing_learner,
    record_batch,
    stream_episodes,
)


def rank_batches(rank: int) -> list:
    """Each rank's batches: rank 1's rewards in other units, and one of its batches non-finite."""
    if rank == 0:
        return [learner_batch(10), learner_batch(11), learner_batch(12)]
    return [learner_batch(20, 100.0), learner_batch(21, 100.0, finite=False), learner_batch(22, 100.0)]

def train_one_rank(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from fastrl.distributed import process_group as distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    try:
        learner = normalizing_learner()
        distributed.join_data_parallel(learner, 2)
        for batch in rank_batches(rank):
            learner.train(batch, env_ids=np.arange(4))
        scale = learner.return_scale
        np.save(f"{out}/rank{rank}.npy", [scale.count, scale.mean, scale.var, scale.scale])
        # Both ranks leave the group together: a rank destroying it while gloo still serves the other
        # aborted now and then ("terminate called without an active exception", SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()

def test_two_ranks_hold_one_scale_of_both_ranks_returns():
    import tempfile

    import torch.multiprocessing

    with tempfile.TemporaryDirectory() as out:
        torch.multiprocessing.spawn(train_one_rank, args=(f"{out}/store", out), nprocs=2)
        ranks = [np.load(f"{out}/rank{rank}.npy") for rank in range(2)]
    np.testing.assert_array_equal(ranks[0], ranks[1])  # bit-identical on both ranks
    streams: dict = {}
    for rank in range(2):
        batches = rank_batches(rank)
        for k, batch in enumerate(batches):
            if batch.is_finite():
                after_skip = k > 0 and not batches[k - 1].is_finite()
                record_batch(streams, rank, batch, restart=np.full(4, after_skip))
    reference = brute_force_returns(stream_episodes(streams), build_config("cartpole-appo").learner.gamma)
    assert ranks[0][0] == reference.size
    assert ranks[0][2] == pytest.approx(reference.var(), rel=1e-9)
