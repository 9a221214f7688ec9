"""Sum tree over replay priorities for proportional prioritized replay (PER, Schaul et al.
2016, "Prioritized Experience Replay", section 3.3 and appendix B.2.1; Ape-X, Horgan et al.
2018).

The tree is 8-ary rather than binary: the 8 children of a node are one 64-byte cache line of
float64, so a descent from the root touches 7 lines at 2^20 leaves instead of 20. Within a
line, a branch-free binary search over pairwise sums picks the child. Sampling and updating
are batched: one numba call walks all queries level by level.
"""
from __future__ import annotations

import operator

import numba
import numpy as np

BRANCHING = 8  # _update and _sample spell out the pairwise sums of exactly 8 children.
_CACHE_LINE_BYTES = 64
# Levels above the leaves that keep the minimum positive priority below each node. Keeping
# it up to the root costs update(512) ~12 us more at 2^20 leaves (measured median 46 vs 34 us);
# with two levels, min() reduces capacity / 64 values instead (~5 us at 2^20).
_MIN_LEVELS = 2


class SumTree:
    """Priorities ``p_i >= 0`` of ``capacity`` replay slots, with O(log n) batched updates and
    stratified proportional sampling ``P(i) = p_i / sum_j p_j``.

    Slots start at priority 0 and a slot with priority 0 is never sampled, so unused slots of a
    partly filled buffer cost nothing. Sums are float64 and every parent is recomputed from its
    children on update (never adjusted by a delta), so totals do not drift and a subtree whose
    leaves are all 0 sums to exactly 0.

    Example::

        tree = SumTree(1_000_000)
        tree.update(np.array([3, 7]), np.array([0.5, 2.0]))
        idx = tree.sample(256, rng)          # int64 [256]
        probs = tree.get(idx) / tree.total()
    """

    def __init__(self, capacity: int):
        capacity = operator.index(capacity)
        if capacity < 1:
            raise ValueError(f"SumTree: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        # Nodes per level, leaves first, up to a single root (a leaf level always exists
        # below the root, so capacity 1 needs no special case).
        level_sizes = [capacity]
        while level_sizes[-1] > 1 or len(level_sizes) == 1:
            level_sizes.append(-(-level_sizes[-1] // BRANCHING))
        level_sizes.reverse()
        # Every level below the root holds whole blocks of BRANCHING children, zero-padded, so
        # no loop needs a bounds check and padding never gets sampled.
        lengths = [BRANCHING] + [BRANCHING * size for size in level_sizes[:-1]]
        self._offsets = np.cumsum([0] + lengths[:-1]).astype(np.int64)
        self._leaf_offset = int(self._offsets[-1])
        self._sums = _cache_aligned(sum(lengths), 0.0)
        # Minimum positive priority below each node of the _MIN_LEVELS levels above the leaves
        # (inf where there is none), indexed like _sums; entries of higher levels stay unused.
        self._min_level = max(0, len(lengths) - 1 - _MIN_LEVELS)
        self._mins = _cache_aligned(self._leaf_offset, np.inf)
        self._rng = np.random.default_rng()

    def __len__(self) -> int:
        return self.capacity

    def total(self) -> float:
        """Sum of all priorities."""
        return float(self._sums[0])

    def min(self) -> float:
        """Smallest positive priority (slots at 0 are unused and are ignored), e.g. for the
        largest importance weight of PER. Reduces capacity / 64 values (~5 us at 2^20).

        Raises:
            ValueError: when no slot has a positive priority.
        """
        start, stop = self._offsets[self._min_level:self._min_level + 2]
        smallest = float(self._mins[start:stop].min())
        if smallest == np.inf:
            raise ValueError("SumTree.min: no slot has a positive priority yet; call update first")
        return smallest

    def get(self, indices) -> np.ndarray:
        """Priorities of ``indices`` (int array of any shape) as a float64 array of that shape.

        Raises:
            IndexError: when an index is outside ``[0, capacity)``.
        """
        indices = _integer_array("get", indices)
        if indices.size and (indices.min() < 0 or indices.max() >= self.capacity):
            raise IndexError(f"SumTree.get: indices must lie in [0, {self.capacity}), got "
                             f"values from {indices.min()} to {indices.max()}")
        return self._sums[self._leaf_offset + indices]

    def __getitem__(self, index):
        if np.ndim(index) == 0:
            return float(self.get(index))
        return self.get(index)

    def update(self, indices, priorities) -> None:
        """Set ``priorities[k]`` at slot ``indices[k]``; for a repeated index the last one wins.

        Args:
            indices: int array of slots in ``[0, capacity)``.
            priorities: array of the same shape, finite and >= 0 (0 marks a slot as unused).

        Raises:
            IndexError: an index is out of range. ValueError: a priority is negative, NaN or
            infinite, or the shapes differ. On error the tree is left unchanged.
        """
        indices = _integer_array("update", indices)
        priorities = np.asarray(priorities, dtype=np.float64)
        if indices.shape != priorities.shape:
            raise ValueError(f"SumTree.update: indices has shape {indices.shape} but priorities "
                             f"has {priorities.shape}")
        indices = indices.astype(np.int64, copy=False).ravel()
        priorities = priorities.ravel()
        bad = _update(self._sums, self._mins, self._offsets, self._min_level, self.capacity,
                      indices, priorities)
        if bad >= 0:
            if not 0 <= indices[bad] < self.capacity:
                raise IndexError(f"SumTree.update: index {indices[bad]} is outside "
                                 f"[0, {self.capacity})")
            raise ValueError(f"SumTree.update: priority {priorities[bad]} for index "
                             f"{indices[bad]} must be finite and >= 0")

    def sample(self, batch_size: int, rng=None) -> np.ndarray:
        """Draw ``batch_size`` slots with probability proportional to priority, stratified.

        The total mass is cut into ``batch_size`` equal slices and one point is drawn uniformly
        in each (PER appendix B.2.1); the slot whose cumulative-priority interval holds the point
        is returned. Slots at priority 0 are never returned, even when rounding puts a point on
        an interval boundary or at the total.

        Args:
            batch_size: number of draws, >= 1.
            rng: numpy Generator, int seed, or None for this tree's own generator (seeded
                from OS entropy at construction).

        Returns:
            int64 ``[batch_size]`` slot indices.

        Raises:
            ValueError: when every priority is 0.
        """
        batch_size = operator.index(batch_size)
        if batch_size < 1:
            raise ValueError(f"SumTree.sample: batch_size must be >= 1, got {batch_size}")
        if not self._sums[0] > 0.0:
            raise ValueError("SumTree.sample: every priority is 0; "
                             "update priorities before sampling")
        rng = self._rng if rng is None else np.random.default_rng(rng)
        return _sample(self._sums, self._offsets, rng.random(batch_size))


def _integer_array(caller: str, indices) -> np.ndarray:
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise ValueError(f"SumTree.{caller}: indices must be integers, got dtype {indices.dtype}")
    return indices


def _cache_aligned(size: int, fill: float) -> np.ndarray:
    # Blocks of BRANCHING float64 start at multiples of 8 elements; aligning the array makes
    # each block exactly one cache line, so loading a block's first child brings in the rest.
    raw = np.full(size + BRANCHING, fill)
    start = (-raw.ctypes.data % _CACHE_LINE_BYTES) // raw.itemsize
    return raw[start:start + size]


@numba.njit(cache=True)
def _update(sums, mins, offsets, min_level, capacity, indices, priorities):
    """Write leaves, then recompute their ancestors; returns the position of the first invalid
    (index, priority) pair without writing anything, or -1."""
    for k in range(indices.shape[0]):
        # Written so that NaN fails the test.
        if not (0 <= indices[k] < capacity and 0.0 <= priorities[k] < np.inf):
            return k
    leaf_level = offsets.shape[0] - 1
    for k in range(indices.shape[0]):
        sums[offsets[leaf_level] + indices[k]] = priorities[k]
    nodes = indices.copy()
    # Level by level, so every child is final before its parent is summed. Only neighbouring
    # repeats are skipped: recomputing a shared ancestor is cheaper than sorting to find them.
    for level in range(leaf_level, 0, -1):
        children = offsets[level]
        parents = offsets[level - 1]
        keep_min = level - 1 >= min_level
        min_source = sums if level == leaf_level else mins
        previous = -1
        for k in range(nodes.shape[0]):
            parent = nodes[k] // BRANCHING
            nodes[k] = parent
            if parent == previous:
                continue
            previous = parent
            first = children + parent * BRANCHING
            # The pairwise order of the descent in _sample, so a parent equals, to the last
            # bit, the mass the descent sees below it.
            sums[parents + parent] = (
                ((sums[first] + sums[first + 1]) + (sums[first + 2] + sums[first + 3]))
                + ((sums[first + 4] + sums[first + 5]) + (sums[first + 6] + sums[first + 7])))
            if keep_min:
                smallest = np.inf
                for j in range(first, first + BRANCHING):
                    smallest = min(smallest, min_source[j] if min_source[j] > 0.0 else np.inf)
                mins[parents + parent] = smallest
    return -1


@numba.njit(cache=True)
def _sample(sums, offsets, uniforms):
    """Stratified targets ``(k + uniforms[k]) * total / n``, then one root-to-leaf descent each,
    all queries advancing one level at a time."""
    batch = uniforms.shape[0]
    residuals = (np.arange(batch) + uniforms) * (sums[0] / batch)
    nodes = np.zeros(batch, dtype=np.int64)
    first_children = np.empty(batch)
    for level in range(1, offsets.shape[0]):
        blocks = offsets[level]
        # Load every block's first child in a pass of its own: these loads are independent, so
        # the CPU overlaps their cache misses instead of waiting on each inside the descent
        # (measured 1.8x faster at 2^20 leaves).
        for k in range(batch):
            first_children[k] = sums[blocks + nodes[k] * BRANCHING]
        for k in range(batch):
            # A branch-free binary search over the block's 8 children by pairwise sums: its
            # comparisons are coin flips that a branch predictor gets wrong half the time.
            # Written out inline: a numba helper returning a tuple runs 1.7x slower.
            first = blocks + nodes[k] * BRANCHING
            residual = residuals[k]
            left_pair = first_children[k] + sums[first + 1]
            left_half = left_pair + (sums[first + 2] + sums[first + 3])
            right_pair = sums[first + 4] + sums[first + 5]
            right = residual >= left_half
            residual = residual - left_half if right else residual
            child = 4 if right else 0
            pair = right_pair if right else left_pair
            right = residual >= pair
            residual = residual - pair if right else residual
            child = child + 2 if right else child
            left_weight = sums[first + child]
            right_weight = sums[first + child + 1]
            right = residual >= left_weight
            residual = residual - left_weight if right else residual
            child = child + 1 if right else child
            if (right_weight if right else left_weight) == 0.0:
                # Rounding carried the residual past the block's mass onto a zero child or
                # padding: take the last positive child (the parent's mass is > 0, so one is).
                child = _last_positive_child(sums, first)
                residual = sums[first + child]
            residuals[k] = residual
            nodes[k] = nodes[k] * BRANCHING + child
    return nodes


@numba.njit(cache=True)
def _last_positive_child(sums, first):
    child = BRANCHING - 1
    while sums[first + child] == 0.0:
        child -= 1
    return child
