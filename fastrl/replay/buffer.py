"""In-learner replay: a ring buffer of env streams, each frame stored once, with proportional
prioritized sampling (PER, Schaul et al. 2016; Ape-X, Horgan et al. 2018).

Two layouts share one store: :class:`TransitionReplay` samples n-step transitions for DQN-style
learners; :class:`SequenceReplay` samples fixed-length time-major sequences for V-trace.

Streams and records
    Vectorized envs interleave their steps, so every env id is its own *stream*, and ``add``
    takes rows from any mix of streams (e.g. 64 envs x 4 steps). Row k of an ``add`` is one
    *record* of stream ``env_ids[k]``: the observation the agent acted on, the action, and the
    reward / terminated / truncated that the action produced; rows of one stream must come in
    time order. The next observation is the next record of the same stream. Envs autoreset on
    the NEXT step (gymnasium 1.x, envpool): after a done the env returns the final observation,
    the action chosen there is discarded and the step after it returns the reset observation.
    So the record after a done holds the final observation and is *not valid* (its action was
    never taken); the record after that starts a new episode (*first*). The first record of a
    stream is first as well.

Storage
    Capacity is split evenly: stream s owns ``L = capacity // num_streams`` slots
    ``s * L + (t mod L)``, where ``t`` counts that stream's records (FIFO per stream: record
    t overwrites record t - L). Each slot holds one frame: for stacked observations
    (``frame_stack = S > 1``, frames on axis 0, newest last, e.g. Atari ``[4, 84, 84]``) only
    the newest frame ``obs[-1]`` is stored, and stacks are rebuilt at sample time. uint8 stays
    uint8. A stream's first observation that is not a reset stack (its frames differ, e.g. a
    replay attached to envs mid-episode) first writes its S - 1 older frames as history records
    (not valid) so that the stacks built later match what the agent saw.

Frame stacking rule
    The stack of record t holds the frames of records t-S+1 .. t; frames before the record's
    episode start are replaced by the episode's first frame. This is what envpool's Atari env
    gives at a reset (``PushStack(push_all)`` fills the whole stack with the reset frame; checked
    on Pong-v5: the 4 frames of a reset observation are equal and non-zero) and what gymnasium's
    ``FrameStackObservation(padding_type="reset")`` does. Frames never cross an episode start or
    a stream. Known difference: with envpool ``episodic_life=True`` a lost life ends the episode
    but envpool keeps the older frames; here the new life starts from a repeated first frame
    (as fastrl's gymnasium Atari backend does).

Sampleable indices (the rule every test checks)
    With ``W`` records written to stream s, the record t in slot ``s * L + t mod L`` may start a
    sample iff

        W - L + (S - 1)  <=  t  <=  W - 1 - h,   and   start_ok(t),

    where ``h`` is the horizon (``n_step`` for transitions; ``sequence_length`` for sequences: its
    last observation is record t + h) and ``start_ok`` is "valid" for transitions and
    ``t mod stride == 0`` for sequences. The lower bound keeps the S - 1 frames under the stack in
    the ring (conservatively, even where an episode start makes them unneeded: S - 1 slots per
    stream); the upper bound waits until every record a sample reads is written. A record's sum-tree
    priority is positive exactly while this holds: it is set when record t + h is written (to the
    arrival priority given to ``add``, else the largest priority seen, as PER) and zeroed when
    record t - S + 1 is overwritten, so unwritten, stale and invalid slots have priority 0 and are
    never sampled. ``L >= S + h`` is required (then the set of record t precedes its zeroing).

Priorities and importance weights
    ``P(i) = p_i^alpha / sum_j p_j^alpha``; weights ``w_i = (N P(i))^-beta / max_j w_j`` with the
    max over the sampled batch (Ape-X; the PER paper's "normalize by 1 / max_i w_i" read per
    batch, as Dopamine does). N cancels: ``w_i = (P(i) / min_batch P)^-beta``, in (0, 1].
    Every slot has a generation counter, incremented when it is written; ``update_priorities``
    drops the entries whose generation changed since sampling or that are no longer sampleable,
    so a learner's late update never revives an overwritten or invalid slot.

Not thread-safe: the learner adds and samples from one thread (the frame store's own threads
only copy, compress and decompress frames).
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from fractions import Fraction

import numba
import numpy as np

from ..config import AT_LEAST_1, UNIT, ReplayConfig, check_section
from ..kernels import SumTree, nstep_windows
from .storage import make_frame_store

# Largest |p| any update may set; keeps p^alpha and the tree's float64 sums finite.
_MAX_PRIORITY = 1e100



def frames_out(out: np.ndarray | None, shape: tuple, dtype, caller: str) -> np.ndarray:
    """The array a sample's frames go into: ``out`` when it is a C-contiguous ``dtype`` array of
    ``shape`` (a caller's staging buffer, reused batch after batch), a new one when it is None."""
    if out is None:
        return np.empty(shape, dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"{caller}: out must be a C-contiguous {dtype} array of shape {shape}")
    return out

class ReplayRatio:
    """Rate limiter: how many batches the learner may sample for the records added so far.

    ``batches_per_transition`` is the target ratio (e.g. 0.25: one batch every 4 env steps, as
    DQN; or replay ratio / batch size); ``start`` records are added before the first batch counts
    (e.g. ``min_fill``), so sampling does not begin with a burst. Kept as an exact fraction, so
    ratios such as 1/3 never drift.

    Example::

        ratio = ReplayRatio(0.25, start=cfg.min_fill)
        for _ in range(ratio.allowed_batches(replay.added, batches_done)):
            ...
    """

    def __init__(self, batches_per_transition: float, start: int = 0):
        self.ratio = Fraction(batches_per_transition).limit_denominator(1_000_000)
        if self.ratio <= 0:
            raise ValueError(f"ReplayRatio: batches_per_transition must be > 0, got "
                             f"{batches_per_transition}")
        self.start = operator.index(start)

    def allowed_batches(self, added: int, sampled: int) -> int:
        """Batches that may be sampled now: ``floor(ratio * (added - start)) - sampled``, >= 0."""
        earned = max(0, added - self.start) * self.ratio.numerator // self.ratio.denominator
        return max(0, earned - sampled)


@dataclass
class TransitionBatch:
    """n-step transitions; ``B`` samples, ``S`` frame stack, ``n`` steps.

    ``frames`` ``[B, S + n, *frame]``: sample b's frames at times t-S+1 .. t+n of its stream,
    padded at its episode start (see the module docstring); columns after an episode's end
    repeat its final frame. ``obs`` is ``frames[:, :S]``, ``next_obs`` the S frames from
    column ``bootstrap_steps``: a view ``frames[:, n:]`` when no window was cut short (always
    for n = 1), a gather otherwise (on a GPU, gather the same columns there). Without stacking
    (S = 1) the stack axis is dropped: ``obs`` ``[B, *obs_shape]``.

    The target is ``returns + discounts * max_a Q(next_obs, a)``: ``returns`` = sum over the
    ``m = bootstrap_steps`` steps of ``gamma^k r_{t+k}``, ``discounts`` = ``gamma^m``, or 0 when
    the episode terminated in the window (``dones``). A truncation also ends the window (m < n)
    but bootstraps from the final observation.
    """

    frames: np.ndarray  # [B, S + n, *frame] obs dtype
    actions: np.ndarray  # [B, *action_shape]
    returns: np.ndarray  # [B] float32
    discounts: np.ndarray  # [B] float32
    dones: np.ndarray  # [B] bool: terminated within the window
    bootstrap_steps: np.ndarray  # [B] int64 m in [1, n]
    indices: np.ndarray  # [B] int64 slots, for update_priorities
    generations: np.ndarray  # [B] int64, for update_priorities
    weights: np.ndarray  # [B] float32 importance weights, max 1
    frame_stack: int

    @property
    def obs(self) -> np.ndarray:
        return self.obs_of(self.frames)

    @property
    def next_obs(self) -> np.ndarray:
        return self.next_obs_of(self.frames)

    def obs_of(self, frames):
        """``obs`` cut from ``frames``: ``self.frames`` or a copy of them (e.g. a torch tensor on
        the learner's device, so that obs and next_obs share one copy of the frames)."""
        return self._unstacked(frames[:, :self.frame_stack])

    def next_obs_of(self, frames):
        """``next_obs`` cut from ``frames`` (as :meth:`obs_of`)."""
        n = frames.shape[1] - self.frame_stack
        if np.all(self.bootstrap_steps == n):
            return self._unstacked(frames[:, n:])
        columns = self.bootstrap_steps[:, None] + np.arange(self.frame_stack)
        return self._unstacked(frames[np.arange(len(columns))[:, None], columns])

    def _unstacked(self, stacks: np.ndarray) -> np.ndarray:
        return stacks if self.frame_stack > 1 else stacks[:, 0]


@dataclass
class SequenceBatch:
    """Time-major sequences, as the V-trace learner's trajectory batches: ``T`` steps, ``B``
    sequences; ``obs`` ``[T + 1, B, *obs_shape]`` (stacks rebuilt), the step arrays ``[T, B]``.
    ``valid`` is False where the action was never taken (the autoreset step after a done, and
    history records)."""

    obs: np.ndarray
    actions: np.ndarray  # [T, B, *action_shape]
    behaviour_logp: np.ndarray  # [T, B] float32 behaviour policy's log-probabilities
    rewards: np.ndarray  # [T, B] float32
    terminated: np.ndarray  # [T, B] bool
    truncated: np.ndarray  # [T, B] bool
    valid: np.ndarray  # [T, B] bool
    indices: np.ndarray  # [B] int64
    generations: np.ndarray  # [B] int64
    weights: np.ndarray  # [B] float32
    initial_state: np.ndarray | None = None  # [B, state_size] float32: recurrent state at each start


class _StreamReplay:
    """Storage, stream bookkeeping and priorities shared by both layouts (module docstring)."""

    def __init__(self, settings: ReplayConfig, *, num_streams: int, obs_shape: tuple, obs_dtype,
                 action_shape: tuple, action_dtype, horizon: int, stride: int, start_needs_valid: bool,
                 step_fields: dict, seed):
        check_section(settings, "replay")
        self.settings = dataclasses.replace(settings)  # later edits of the caller's copy do not half-apply
        self.num_streams = operator.index(num_streams)
        self.obs_shape = tuple(obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self.frame_stack = operator.index(settings.frame_stack)
        self.action_shape = tuple(action_shape)
        self.action_dtype = np.dtype(action_dtype)
        self.horizon, self.stride, self._start_needs_valid = horizon, stride, start_needs_valid
        if self.num_streams < 1 or self.frame_stack < 1:
            raise ValueError(f"replay: num_streams and frame_stack must be >= 1, got "
                             f"{num_streams}, {self.frame_stack}")
        if self.frame_stack > 1 and self.obs_shape[:1] != (self.frame_stack,):
            raise ValueError(f"replay: stacked observations need the stack on axis 0, but "
                             f"obs_shape {self.obs_shape} does not start with frame_stack "
                             f"{self.frame_stack}")
        self.ring_len = settings.capacity // self.num_streams
        if self.ring_len < self.frame_stack + horizon:
            raise ValueError(
                f"replay: capacity {settings.capacity} gives each of {self.num_streams} streams "
                f"{self.ring_len} slots; it needs at least frame_stack + horizon = "
                f"{self.frame_stack + horizon}: raise capacity or use fewer streams")
        self.capacity = self.ring_len * self.num_streams
        if settings.min_fill > self.capacity:
            raise ValueError(f"replay: min_fill {settings.min_fill} exceeds the capacity "
                             f"{self.capacity}, so sampling could never start")
        self.frame_shape = self.obs_shape[1:] if self.frame_stack > 1 else self.obs_shape
        self._frames = make_frame_store(self.capacity, self.frame_shape, self.obs_dtype,
                                        settings.compress or None, settings.threads,
                                        settings.memmap_dir or None)
        C = self.capacity
        step_fields = {"actions": (self.action_shape, self.action_dtype),
                       "rewards": ((), np.float32), **step_fields}
        self._steps = {name: np.zeros((C, *shape), dtype)
                       for name, (shape, dtype) in step_fields.items()}
        self._terminated = np.zeros(C, dtype=bool)
        self._truncated = np.zeros(C, dtype=bool)
        self._first = np.zeros(C, dtype=bool)
        self._valid = np.zeros(C, dtype=bool)
        self._generation = np.zeros(C, dtype=np.int64)
        self._arrival = np.full(C, np.nan)  # p^alpha given at add time; NaN: the max priority
        self._written = np.zeros(self.num_streams, dtype=np.int64)  # W per stream
        self._done_last = np.zeros(self.num_streams, dtype=bool)  # last record had a done
        self._final_last = np.zeros(self.num_streams, dtype=bool)  # last record was the final obs
        self._tree = SumTree(C)
        self._max_priority = 1.0
        self._rng = np.random.default_rng(seed)
        self.added = 0  # records added over the buffer's life (history records included)

    # ---------------------------------------------------------------- public

    def __len__(self) -> int:
        """Records stored now."""
        return int(np.minimum(self._written, self.ring_len).sum())

    @property
    def nbytes(self) -> int:
        """Bytes held by frames and per-slot arrays (the sum tree adds ~10 bytes per slot)."""
        arrays = [*self._steps.values(), self._terminated, self._truncated, self._first,
                  self._valid, self._generation]
        return self._frames.nbytes + sum(a.nbytes for a in arrays)

    def stream_length(self, stream: int) -> int:
        """Records written to ``stream`` over the buffer's life."""
        return int(self._written[stream])

    def restart_streams(self, env_ids, ended=None) -> None:
        """The next record of each stream in ``env_ids`` does not follow the stream's last record
        (e.g. the env was recreated after its worker crashed, or the learner dropped the steps in
        between).

        Transitions: the last ``n_step`` records become invalid, as their n-step windows would
        read the new episode as their future; they have no priority yet (the upper bound of the
        sampleable rule), so none is revoked. Sequences: the last record, whose step leads into
        the new episode, becomes invalid, which cuts V-trace's trace as an autoreset step does.

        ``ended`` (``[len(env_ids)]`` bool, default all False): the last step before the gap ended
        an episode, so the next record is its final observation, whose action the autoreset
        discards (not valid), and the record after it starts the new episode. Otherwise the next
        record starts one. Where a stream appears twice, its last entry counts."""
        env_ids = np.asarray(env_ids, dtype=np.int64).ravel()
        ended = np.zeros(len(env_ids), bool) if ended is None else np.asarray(ended, bool).ravel()
        if ended.shape != env_ids.shape:
            raise ValueError(f"restart_streams: ended must have shape [{len(env_ids)}], got "
                             f"{list(ended.shape)}")
        for stream, stream_ended in dict(zip(env_ids.tolist(), ended.tolist())).items():
            written = int(self._written[stream])
            if written:
                cut = self.horizon if self._start_needs_valid else 1
                times = np.arange(max(0, written - cut), written)
                self._valid[stream * self.ring_len + times % self.ring_len] = False
                self._final_last[stream] = True  # the next record is "first"
            self._done_last[stream] = stream_ended  # ... and valid unless it follows a done

    def sampleable(self, indices) -> np.ndarray:
        """bool array: which slots may start a sample now (the rule in the module docstring)."""
        indices = np.asarray(indices, dtype=np.int64)
        written = self._written[indices // self.ring_len]
        t = _record_time(indices, written, self.ring_len)
        ok = (t >= written - self.ring_len + self.frame_stack - 1)
        ok &= (t <= written - 1 - self.horizon) & (t >= 0) & (t % self.stride == 0)
        return ok & self._valid[indices] if self._start_needs_valid else ok

    def priorities(self, indices) -> np.ndarray:
        """Sampling weights ``p^alpha`` of ``indices`` (float64); 0 where not sampleable."""
        return self._tree.get(np.asarray(indices, dtype=np.int64))

    def update_priorities(self, indices, generations, priorities) -> int:
        """Set the priorities ``p`` (e.g. ``|TD error| + eps``) of sampled slots; the tree holds
        ``p^alpha``. Entries whose slot was rewritten since it was sampled (generation changed)
        or that are no longer sampleable are dropped. Returns the number applied.

        Args:
            indices, generations: ``[K]`` int64 from a batch. priorities: ``[K]`` finite, >= 0.
        """
        indices = np.asarray(indices, dtype=np.int64).ravel()
        generations = np.asarray(generations, dtype=np.int64).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if not indices.shape == generations.shape == priorities.shape:
            raise ValueError(f"update_priorities: indices {indices.shape}, generations "
                             f"{generations.shape} and priorities {priorities.shape} must match")
        bad = ~((priorities >= 0) & (priorities <= _MAX_PRIORITY))  # NaN fails both tests
        if bad.any():
            raise ValueError(f"update_priorities: priorities must be finite and >= 0, got "
                             f"{priorities[bad][:5]}")
        if indices.size and (indices.min() < 0 or indices.max() >= self.capacity):
            raise IndexError(f"update_priorities: indices must lie in [0, {self.capacity})")
        keep = (self._generation[indices] == generations) & self.sampleable(indices)
        if keep.any():
            kept = priorities[keep]
            self._max_priority = max(self._max_priority, float(kept.max()))
            self._tree.update(indices[keep], kept ** self.settings.alpha)
        return int(keep.sum())

    def close(self) -> None:
        """Stop the codec threads and release the frame memory (or scratch file)."""
        self._frames.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- saving (fastrl.replay.snapshot)

    def snapshot_layout(self) -> dict:
        """What a saved replay must share with this one to load into it (plain data)."""
        return {"kind": type(self).__name__, "capacity": self.capacity, "num_streams": self.num_streams,
                "obs_shape": list(self.obs_shape), "obs_dtype": self.obs_dtype.str, "frame_stack": self.frame_stack,
                "action_shape": list(self.action_shape), "action_dtype": self.action_dtype.str,
                "horizon": self.horizon, "stride": self.stride, "alpha": float(self.settings.alpha),
                "state_size": int(getattr(self, "state_size", 0))}

    def snapshot_arrays(self) -> dict[str, np.ndarray]:
        """Every per-slot and per-stream array but the frames (the tree's leaves as "priorities")."""
        arrays = {f"step_{name}": array for name, array in self._steps.items()}
        arrays.update(terminated=self._terminated, truncated=self._truncated, first=self._first, valid=self._valid,
                      generation=self._generation, arrival=self._arrival, written=self._written,
                      done_last=self._done_last, final_last=self._final_last,
                      priorities=self._tree.get(np.arange(self.capacity)))
        states = getattr(self, "_states", None)
        if states is not None:
            arrays["states"] = states
        return arrays

    def snapshot_scalars(self) -> dict:
        return {"added": int(self.added), "max_priority": float(self._max_priority),
                "rng": self._rng.bit_generator.state}

    def written_ranges(self) -> list[tuple[int, int]]:
        """The ``[start, stop)`` slot ranges that hold frames: each stream's first
        ``min(written, ring_len)`` slots."""
        return written_slot_ranges(self._written, self.ring_len)

    def read_frames(self, start: int, stop: int, out: np.ndarray) -> None:
        self._frames.read(np.arange(start, stop), out)

    def write_frames(self, start: int, stop: int, frames: np.ndarray) -> None:
        self._frames.write(np.arange(start, stop), frames)

    def restore_snapshot(self, arrays: dict[str, np.ndarray], scalars: dict) -> None:
        """Load what :meth:`snapshot_arrays` and :meth:`snapshot_scalars` gave (frames apart, by
        :meth:`write_frames`); the caller checked the layout. Every stream then restarts: the
        envs of a resumed run begin new episodes."""
        for name, array in self._steps.items():
            array[...] = arrays[f"step_{name}"]
        for name in ("terminated", "truncated", "first", "valid", "generation", "arrival", "written", "done_last",
                     "final_last"):
            getattr(self, f"_{name}")[...] = arrays[name]
        states = getattr(self, "_states", None)
        if states is not None:
            states[...] = arrays["states"]
        self._tree.update(np.arange(self.capacity), arrays["priorities"])
        self.added = int(scalars["added"])
        self._max_priority = float(scalars["max_priority"])
        self._rng.bit_generator.state = scalars["rng"]
        self.restart_streams(np.arange(self.num_streams))

    # ---------------------------------------------------------------- adding

    def _add(self, env_ids, obs, steps: dict, terminated, truncated, priorities=None, states=None) -> None:
        env_ids = np.asarray(env_ids).astype(np.int64, copy=False).ravel()
        rows = len(env_ids)
        obs = np.asarray(obs)
        if obs.dtype != self.obs_dtype or obs.shape != (rows, *self.obs_shape):
            raise ValueError(f"replay.add: obs must be {self.obs_dtype} [{rows}, "
                             f"{', '.join(map(str, self.obs_shape))}] for {rows} env ids, got "
                             f"{obs.dtype} {list(obs.shape)}")
        if rows and (env_ids.min() < 0 or env_ids.max() >= self.num_streams):
            raise ValueError(f"replay.add: env ids must lie in [0, {self.num_streams}), got "
                             f"{env_ids.min()} .. {env_ids.max()}")
        if rows and np.bincount(env_ids).max() > self.ring_len:
            raise ValueError(f"replay.add: one stream got more rows than its {self.ring_len} "
                             f"slots in one call; add fewer rows per call")
        values = {"terminated": np.asarray(terminated, dtype=bool),
                  "truncated": np.asarray(truncated, dtype=bool)}
        for name, value in steps.items():
            values[name] = np.asarray(value, dtype=self._steps[name].dtype)
        for name, value in values.items():
            expected = self._steps[name].shape[1:] if name in self._steps else ()
            if value.shape != (rows, *expected):
                raise ValueError(f"replay.add: {name} must have shape "
                                 f"{[rows, *expected]}, got {list(value.shape)}")
        if priorities is not None:
            priorities = np.asarray(priorities, dtype=np.float64)
            if priorities.shape != (rows,):
                raise ValueError(f"replay.add: priorities must have shape [{rows}], got {list(priorities.shape)}")
            if not ((priorities >= 0) & (priorities <= _MAX_PRIORITY)).all():
                raise ValueError("replay.add: priorities must be finite and >= 0")
        if not rows:
            return
        if self.frame_stack > 1:
            self._start_streams(env_ids, obs)
        self._write(env_ids, obs[:, -1] if self.frame_stack > 1 else obs, values, history=False,
                    priorities=priorities, states=states)

    def _start_streams(self, env_ids: np.ndarray, obs: np.ndarray) -> None:
        """History records for streams whose first observation is not a reset stack."""
        fresh = np.flatnonzero(self._written[env_ids] == 0)
        if not fresh.size:
            return
        streams, first_rows = np.unique(env_ids[fresh], return_index=True)
        count = self.frame_stack - 1
        for stream, row in zip(streams, fresh[first_rows]):
            stack = obs[row]
            if np.array_equal(stack[:-1], np.broadcast_to(stack[-1], stack[:-1].shape)):
                continue
            blanks = {name: np.zeros((count, *array.shape[1:]), array.dtype)
                      for name, array in self._steps.items()}
            blanks["terminated"] = blanks["truncated"] = np.zeros(count, dtype=bool)
            self._write(np.full(count, stream, dtype=np.int64), stack[:-1], blanks, history=True)

    def _write(self, env_ids, frames, values: dict, history: bool, priorities=None, states=None) -> None:
        rows = len(env_ids)
        slots, times = np.empty(rows, np.int64), np.empty(rows, np.int64)
        first, valid = np.empty(rows, bool), np.empty(rows, bool)
        _place_records(env_ids, values["terminated"] | values["truncated"], self._written,
                       self._done_last, self._final_last, self.ring_len, slots, times, first, valid)
        self._write_states(slots, times, states)
        if history:
            valid[:] = False
        self._frames.write(slots, frames)
        self._first[slots] = first
        self._valid[slots] = valid
        self._terminated[slots] = values["terminated"]
        self._truncated[slots] = values["truncated"]
        for name, array in self._steps.items():
            array[slots] = values[name]
        self._generation[slots] += 1
        if priorities is None:
            self._arrival[slots] = np.nan
        else:
            self._arrival[slots] = priorities ** self.settings.alpha
            if rows:
                self._max_priority = max(self._max_priority, float(priorities.max()))
        changed = np.empty(2 * rows, np.int64)
        priorities = np.empty(2 * rows, np.float64)
        count = _priority_changes(slots, times, self.ring_len, self.frame_stack, self.horizon,
                                  self.stride, self._start_needs_valid, self._valid,
                                  self._max_priority ** self.settings.alpha, self._arrival, changed, priorities)
        if count:
            self._tree.update(changed[:count], priorities[:count])
        self.added += rows

    def _write_states(self, slots, times, states) -> None:
        """Layouts that keep recurrent states store them here (see SequenceReplay)."""

    # ---------------------------------------------------------------- sampling

    def _sample_slots(self, batch_size: int, rng, beta):
        """(indices, generations, weights) of a prioritized draw, or None before min_fill."""
        if len(self) < self.settings.min_fill or not self._tree.total() > 0:
            return None
        indices = self._tree.sample(batch_size, self._rng if rng is None else rng)
        priorities = self._tree.get(indices)
        beta = self.settings.beta if beta is None else beta
        weights = (priorities / priorities.min()) ** -beta
        return indices, self._generation[indices].copy(), weights.astype(np.float32)


class TransitionReplay(_StreamReplay):
    """Prioritized n-step transition replay (DQN, Ape-X). See the module docstring for the rules.

    Example (64 envpool Atari envs, stacked obs ``[4, 84, 84]``)::

        replay = TransitionReplay(ReplayConfig(capacity=1_000_000, frame_stack=4), gamma=0.99,
                                  num_streams=64, obs_shape=(4, 84, 84))
        replay.add(env_ids, obs, actions, rewards, terminated, truncated)   # any chunk of rows
        batch = replay.sample(512)          # None until min_fill records are stored
        td = ...                            # from batch.obs, batch.next_obs, batch.returns ...
        replay.update_priorities(batch.indices, batch.generations, np.abs(td) + 1e-6)
    """

    def __init__(self, settings: ReplayConfig, *, gamma: float, num_streams: int,
                 obs_shape: tuple, obs_dtype=np.uint8, action_shape: tuple = (),
                 action_dtype=np.int64, seed=None):
        """``settings`` the user's ``[replay]`` section (``n_step`` steps per target, frame_stack,
        storage); ``gamma`` the discount of the n-step return (the learner's)."""
        if gamma not in UNIT:
            raise ValueError(f"TransitionReplay: gamma must be {UNIT}, got {gamma!r}")
        self.gamma = float(gamma)
        super().__init__(settings, num_streams=num_streams, obs_shape=obs_shape,
                         obs_dtype=obs_dtype, action_shape=action_shape, action_dtype=action_dtype,
                         horizon=settings.n_step, stride=1, start_needs_valid=True, step_fields={},
                         seed=seed)

    def add(self, env_ids, obs, actions, rewards, terminated, truncated, priorities=None) -> None:
        """Append one record per row (rows of a stream in time order).

        Args:
            env_ids: ``[N]`` ints in ``[0, num_streams)``.
            obs: ``[N, *obs_shape]`` the observations the actions were chosen on (obs dtype).
            actions: ``[N, *action_shape]``. rewards: ``[N]``. terminated, truncated: ``[N]``
                bool, as returned by the step that took the action.
            priorities: optional ``[N]`` priorities ``p`` (e.g. ``|TD error| + eps`` computed by
                the actor, as Ape-X): a record enters the tree with ``p^alpha`` once it becomes
                sampleable. None: the largest priority seen so far (PER).
        """
        self._add(env_ids, obs, {"actions": actions, "rewards": rewards}, terminated, truncated, priorities)

    def frames_shape(self, batch_size: int) -> tuple:
        """Shape of a sample's ``frames``: ``[batch_size, S + n, *frame]``."""
        return (batch_size, self.frame_stack + self.horizon, *self.frame_shape)

    def sample(self, batch_size: int, rng=None, beta: float | None = None,
               out: np.ndarray | None = None) -> TransitionBatch | None:
        """Draw ``batch_size`` transitions by priority; None until ``min_fill`` records are stored
        (or while nothing is sampleable).

        Args:
            rng: numpy Generator or seed; None uses the buffer's own generator.
            beta: importance-weight exponent; None uses ``settings.beta``.
            out: optional C-contiguous ``[batch_size, S + n, *frame]`` array of the obs dtype to
                fill (e.g. pinned memory reused across batches); returned as ``batch.frames``.
        """
        drawn = self._sample_slots(batch_size, rng, beta)
        if drawn is None:
            return None
        indices, generations, weights = drawn
        shape = self.frames_shape(batch_size)
        out = frames_out(out, shape, self.obs_dtype, "TransitionReplay.sample")
        n, S = self.horizon, self.frame_stack
        rows = np.empty((batch_size, S + n), np.int64)
        returns, discounts = np.empty(batch_size, np.float32), np.empty(batch_size, np.float32)
        dones, steps = np.empty(batch_size, bool), np.empty(batch_size, np.int64)
        _plan_transitions(indices, self._written, self.ring_len, S, n, self.gamma,
                          self._first, self._steps["rewards"], self._terminated, self._truncated,
                          rows, returns, discounts, dones, steps)
        self._frames.read(rows.ravel(), out)
        return TransitionBatch(frames=out, actions=self._steps["actions"][indices], returns=returns,
                               discounts=discounts, dones=dones, bootstrap_steps=steps,
                               indices=indices, generations=generations, weights=weights,
                               frame_stack=S)


class SequenceReplay(_StreamReplay):
    """Prioritized replay of fixed-length sequences for V-trace (IMPALA-style replay).

    Sequences start every ``sequence_stride`` records of a stream and span
    ``T = sequence_length`` steps (``T + 1`` observations); they may cross episode ends,
    which ``terminated`` / ``truncated`` / ``valid`` mark exactly as in the learner's
    trajectory batches. Overlapping sequences share storage: every record is stored once.
    """

    def __init__(self, settings: ReplayConfig, *, sequence_length: int, sequence_stride: int,
                 num_streams: int, obs_shape: tuple, obs_dtype=np.uint8, action_shape: tuple = (),
                 action_dtype=np.int64, seed=None, state_size: int = 0):
        """``settings`` the user's ``[replay]`` section (frame_stack, storage, sampling);
        ``sequence_length`` and ``sequence_stride`` the learner's (R2D2: 80 and 40).
        ``state_size`` > 0 keeps a recurrent state per sequence start (R2D2's stored state): only
        at starts, not per record, so an Atari LSTM's 1024 floats cost capacity / stride rows; each
        stream's capacity is then rounded down to a multiple of the stride."""
        for name, value in (("sequence_length", sequence_length), ("sequence_stride", sequence_stride)):
            if operator.index(value) not in AT_LEAST_1:
                raise ValueError(f"SequenceReplay: {name} must be an integer {AT_LEAST_1}, got {value}")
        if state_size:
            per_stream = settings.capacity // num_streams // sequence_stride * sequence_stride
            settings = dataclasses.replace(settings, capacity=per_stream * num_streams)
        super().__init__(settings, num_streams=num_streams, obs_shape=obs_shape,
                         obs_dtype=obs_dtype, action_shape=action_shape, action_dtype=action_dtype,
                         horizon=sequence_length, stride=sequence_stride, start_needs_valid=False,
                         step_fields={"behaviour_logp": ((), np.float32)}, seed=seed)
        self.state_size = state_size
        self._states = np.zeros((self.capacity // sequence_stride, state_size), np.float32) if state_size else None

    def add(self, env_ids, obs, actions, rewards, terminated, truncated, behaviour_logp, states=None) -> None:
        """As :meth:`TransitionReplay.add`, plus ``behaviour_logp`` ``[N]``: the behaviour policy's
        log-probability of each action, and with ``state_size``, ``states`` ``[N, state_size]``:
        the recurrent state each record's action was chosen with (kept where a sequence starts)."""
        if (states is None) != (self._states is None):
            raise ValueError("SequenceReplay.add: states [N, state_size] are needed exactly when state_size > 0")
        self._add(env_ids, obs, {"actions": actions, "rewards": rewards, "behaviour_logp": behaviour_logp},
                  terminated, truncated, states=states)

    def _write_states(self, slots, times, states) -> None:
        if self._states is None:
            return
        starts = times % self.stride == 0
        # Slots of a stream start at a multiple of ring_len, itself a multiple of the stride.
        self._states[slots[starts] // self.stride] = 0.0 if states is None else np.asarray(states)[starts]

    def obs_shape_of(self, batch_size: int) -> tuple:
        """The shape of a sample's ``obs``: ``[T + 1, batch_size, *obs_shape]``."""
        return (self.horizon + 1, batch_size, *self.obs_shape)

    def sample(self, batch_size: int, rng=None, beta: float | None = None,
               out: np.ndarray | None = None) -> SequenceBatch | None:
        """Draw ``batch_size`` sequences by priority, time-major; None before ``min_fill``.
        ``out``: optional C-contiguous array of :meth:`obs_shape_of` and the obs dtype to hold
        the observations (a learner's pinned staging buffer), else a new one."""
        drawn = self._sample_slots(batch_size, rng, beta)
        if drawn is None:
            return None
        indices, generations, weights = drawn
        T, S = self.horizon, self.frame_stack
        steps = np.empty((T + 1, batch_size), np.int64)
        rows = np.empty((T + 1, batch_size, S), np.int64)
        _plan_sequences(indices, self._written, self.ring_len, self._first, steps, rows)
        shape = self.obs_shape_of(batch_size)
        out = frames_out(out, shape, self.obs_dtype, "SequenceReplay.sample")
        obs = out
        self._frames.read(rows.ravel(), obs)
        taken = steps[:-1]
        return SequenceBatch(obs=obs, actions=self._steps["actions"][taken],
                             behaviour_logp=self._steps["behaviour_logp"][taken],
                             rewards=self._steps["rewards"][taken], terminated=self._terminated[taken],
                             truncated=self._truncated[taken], valid=self._valid[taken], indices=indices,
                             generations=generations, weights=weights,
                             initial_state=None if self._states is None else self._states[indices // self.stride])


def written_slot_ranges(written: np.ndarray, ring_len: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` slot ranges holding frames for per-stream record counts ``written``."""
    held = np.minimum(written, ring_len)
    return [(s * ring_len, s * ring_len + int(n)) for s, n in enumerate(held) if n]


@numba.njit(cache=True)
def _record_time(slot, written, ring_len):
    """Stream time t of the record now in ``slot`` (negative where none was written yet): the
    largest t < W with t mod L equal to the slot's position. Scalars or arrays."""
    return written - 1 - (written - 1 - slot % ring_len) % ring_len


@numba.njit(cache=True)
def _place_records(env_ids, done, written, done_last, final_last, ring_len, slots, times, first,
                   valid):
    """Give row k the next record of its stream, in row order, and derive first / valid from the
    stream's previous records (NEXT_STEP autoreset, module docstring). Advances the streams."""
    for k in range(env_ids.shape[0]):
        stream = env_ids[k]
        t = written[stream]
        slots[k] = stream * ring_len + t % ring_len
        times[k] = t
        first[k] = t == 0 or final_last[stream]
        valid[k] = not done_last[stream]
        final_last[stream] = done_last[stream]
        done_last[stream] = done[k]
        written[stream] = t + 1


@numba.njit(cache=True)
def _priority_changes(slots, times, ring_len, stack, horizon, stride, start_needs_valid, valid,
                      new_priority, initial, changed, priorities):
    """The tree writes that keep "priority > 0 iff sampleable" after writing each record in
    order: record t makes t - horizon complete (set to its arrival priority ``initial[slot]``, or
    to new_priority where that is NaN, if it may start a sample)
    and pushes the oldest frame under record t - (L - S + 1)'s stack out of the ring (zero).
    Applied in order with the last write winning. Returns the number of writes."""
    count = 0
    for k in range(slots.shape[0]):
        base = slots[k] - slots[k] % ring_len
        t = times[k]
        stale = t - (ring_len - stack + 1)
        if stale >= 0:
            changed[count] = base + stale % ring_len
            priorities[count] = 0.0
            count += 1
        start = t - horizon
        if start >= 0 and start % stride == 0:
            slot = base + start % ring_len
            if valid[slot] or not start_needs_valid:
                changed[count] = slot
                arrival = initial[slot]
                priorities[count] = new_priority if np.isnan(arrival) else arrival
                count += 1
    return count


@numba.njit(cache=True)
def _stack_rows(first, base, ring_len, t, out):
    """``out[k]`` = slot of the frame at time t - S + 1 + k of the stream whose slots start at
    ``base``, repeating the episode's first frame before its start (S = len(out))."""
    for k in range(out.shape[0] - 1, -1, -1):
        slot = base + t % ring_len
        out[k] = slot
        if not first[slot]:
            t -= 1


@numba.njit(cache=True)
def _plan_transitions(indices, written, ring_len, stack, n, gamma, first, rewards, terminated,
                      truncated, rows, returns, discounts, dones, steps):
    """Per sample: its n-step target by :func:`fastrl.kernels.nstep_windows` and the frame slots
    of its block (``rows[b]``: stack at t, then t+1 .. t+n with times after the window's end
    clamped to it). The kernel's windows stop before an invalid step; here that is the step after
    the window's first terminated or truncated one, which next-step autoreset makes invalid. The
    ring's own valid flags are not passed: restart_streams clears them on records that may not
    start a window but that earlier windows still run through."""
    B = indices.shape[0]
    # The windows' steps, time-major [n, B], and their sums in float64 (stored as float32).
    step_rewards, step_discounts = np.empty((n, B)), np.empty((n, B))
    step_valid = np.empty((n, B), np.bool_)
    totals, scales = np.empty(B), np.empty(B)
    bases, times = np.empty(B, np.int64), np.empty(B, np.int64)
    for b in range(B):
        index = indices[b]
        base = index - index % ring_len
        t = _record_time(index, written[index // ring_len], ring_len)
        bases[b], times[b] = base, t
        after_done = False
        for k in range(n):
            slot = base + (t + k) % ring_len
            step_rewards[k, b] = rewards[slot]
            step_discounts[k, b] = 0.0 if terminated[slot] else gamma
            step_valid[k, b] = not after_done
            after_done = terminated[slot] or truncated[slot]
    nstep_windows(step_rewards, step_discounts, step_valid, totals, scales, steps)
    for b in range(B):
        base, t, m = bases[b], times[b], steps[b]
        _stack_rows(first, base, ring_len, t, rows[b, :stack])
        for j in range(1, n + 1):
            rows[b, stack - 1 + j] = base + (t + min(j, m)) % ring_len
        returns[b] = totals[b]
        discounts[b] = scales[b]
        dones[b] = terminated[base + (t + m - 1) % ring_len]


@numba.njit(cache=True)
def _plan_sequences(indices, written, ring_len, first, steps, rows):
    """Per sequence b and time tau: ``steps[tau, b]`` the record's slot, ``rows[tau, b]`` the
    slots of its frame stack."""
    for b in range(indices.shape[0]):
        index = indices[b]
        base = index - index % ring_len
        t = _record_time(index, written[index // ring_len], ring_len)
        for tau in range(steps.shape[0]):
            steps[tau, b] = base + (t + tau) % ring_len
            _stack_rows(first, base, ring_len, t + tau, rows[tau, b])


__all__ = ["ReplayRatio", "SequenceBatch", "SequenceReplay", "TransitionBatch",
           "TransitionReplay"]
