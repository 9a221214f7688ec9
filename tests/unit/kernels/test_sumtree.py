"""SumTree: totals, last-write-wins updates, stratified proportional sampling, edge cases."""
import numpy as np
import pytest

from fastrl.kernels import SumTree, sumtree


def apply_updates(priorities, indices, values):
    """What update() must do, one write at a time so that the last duplicate wins."""
    for index, value in zip(indices, values):
        priorities[index] = value


@pytest.mark.parametrize("capacity", [1, 7, 8, 9, 64, 1000, 4099])
def test_totals_get_and_min_follow_random_updates(capacity):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    expected = np.zeros(capacity)
    for _ in range(5):
        # Twice as many writes as slots: plenty of duplicates in every batch.
        indices = rng.integers(0, capacity, 2 * capacity)
        values = np.where(rng.random(2 * capacity) < 0.3, 0.0, rng.exponential(size=2 * capacity))
        tree.update(indices, values)
        apply_updates(expected, indices, values)
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), expected)
        assert tree.total() == pytest.approx(expected.sum(), rel=1e-12, abs=0.0)
        if (expected > 0).any():
            assert tree.min() == expected[expected > 0].min()
    assert len(tree) == capacity
    assert tree[capacity - 1] == expected[-1] and isinstance(tree[0], float)


def test_zeroing_every_slot_leaves_an_exactly_empty_tree():
    tree = SumTree(1000)
    rng = np.random.default_rng(0)
    tree.update(np.arange(1000), rng.random(1000))
    tree.update(np.arange(1000), np.zeros(1000))
    assert tree.total() == 0.0
    with pytest.raises(ValueError, match="every priority is 0"):
        tree.sample(4)
    with pytest.raises(ValueError, match="no slot has a positive priority"):
        tree.min()


def test_stratified_sampling_of_equal_priorities_hits_each_slot_once():
    tree = SumTree(64)
    tree.update(np.arange(64), np.ones(64))
    np.testing.assert_array_equal(tree.sample(64, rng=0), np.arange(64))


def test_sampling_frequencies_match_priorities():
    capacity, batch_size, calls = 50, 32, 2000
    rng = np.random.default_rng(1)
    priorities = rng.exponential(size=capacity) * (rng.random(capacity) < 0.8)
    tree = SumTree(capacity)
    tree.update(np.arange(capacity), priorities)
    counts = np.bincount(np.concatenate([tree.sample(batch_size, rng) for _ in range(calls)]),
                         minlength=capacity)
    positive = priorities > 0
    assert counts[~positive].sum() == 0
    expected = batch_size * calls * priorities[positive] / priorities.sum()
    chi_square = ((counts[positive] - expected) ** 2 / expected).sum()
    # Pearson's statistic for multinomial draws has mean df and sd sqrt(2 df); stratified draws
    # vary less, so a bound of df + 6 sd fails only for a wrong distribution.
    dof = positive.sum() - 1
    assert chi_square < dof + 6 * np.sqrt(2 * dof)


@pytest.mark.parametrize("capacity,filled", [(1000, 1000), (4099, 300), (77, 1)])
def test_zero_priorities_and_unused_slots_are_never_sampled(capacity, filled):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    # Mostly zeros among the first `filled` slots; the rest of the tree is never written.
    values = np.where(rng.random(filled) < 0.9, 0.0, rng.random(filled) + 1e-3)
    values[-1] = 0.5
    tree.update(np.arange(filled), values)
    samples = np.concatenate([tree.sample(256, rng) for _ in range(40)])
    assert (tree.get(samples) > 0).all()
    assert samples.min() >= 0 and samples.max() < filled


def test_draws_on_boundaries_and_at_the_total_land_on_positive_slots():
    # Slots 1-2 and 5-6 are zero; capacity 7 leaves padding after slot 6 in the leaf block.
    tree = SumTree(7)
    tree.update(np.arange(7), np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]))
    # Drive the kernel with chosen uniforms, as rounding could: targets 0, 1 and 2 fall
    # exactly on interval boundaries, and a target equal to the total (uniform 1.0 in the last
    # stratum) lies past all the mass.
    picks = sumtree._sample(tree._sums, tree._offsets, np.array([0.0, 0.0, 0.0]))
    np.testing.assert_array_equal(picks, [0, 3, 4])
    at_total = sumtree._sample(tree._sums, tree._offsets, np.array([1.0]))
    np.testing.assert_array_equal(at_total, [4])
    # Three levels: past the mass at every level on the way down to the last positive slot.
    deep = SumTree(100)
    deep.update(np.array([3, 40]), np.array([1.0, 2.0]))
    np.testing.assert_array_equal(sumtree._sample(deep._sums, deep._offsets, np.array([1.0])), [40])


def test_sampling_is_reproducible_with_a_seed():
    tree = SumTree(300)
    tree.update(np.arange(300), np.linspace(0.0, 1.0, 300))
    np.testing.assert_array_equal(tree.sample(16, rng=7), tree.sample(16, rng=7))


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_invalid_priorities_are_rejected_and_change_nothing(bad):
    tree = SumTree(10)
    tree.update(np.array([0, 1]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        tree.update(np.array([0, 1]), np.array([5.0, bad]))
    assert tree.total() == 3.0 and tree[0] == 1.0


@pytest.mark.parametrize("index", [-1, 10])
def test_out_of_range_indices_are_rejected(index):
    tree = SumTree(10)
    with pytest.raises(IndexError, match=r"outside \[0, 10\)"):
        tree.update(np.array([index]), np.array([1.0]))
    with pytest.raises(IndexError):
        tree.get(np.array([index]))


def test_mismatched_or_non_integer_arguments_are_rejected():
    tree = SumTree(10)
    with pytest.raises(ValueError, match="indices has shape"):
        tree.update(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="indices must be integers"):
        tree.update(np.array([0.0]), np.array([1.0]))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        SumTree(0)
