"""fastrl.replay.snapshot: a replay saved and loaded into a fresh one samples what the original
samples (once both restart their streams, as a resumed run's envs do), in every store and layout;
another layout, or damaged files, are refused in one line; a run keeps one checkpoint's replays."""
import json
import re

import numpy as np
import pytest

from fastrl.config import ReplayConfig
from fastrl.replay.buffer import SequenceReplay, TransitionReplay
from fastrl.replay.snapshot import (
    ReplaySnapshotError,
    load_replay,
    newest_saved_replay,
    remove_partial_replays,
    remove_saved_replays,
    replay_dir,
    save_replay,
    save_replays,
)
from tests.unit.replay.test_buffer import stream_of_frames


def transition_replay(seed=0, **settings):
    options = {"capacity": 240, "min_fill": 1, "n_step": 2, "frame_stack": 4, "alpha": 0.6, **settings}
    return TransitionReplay(ReplayConfig(**options), gamma=0.99, num_streams=4, obs_shape=(4, 84, 84), seed=seed)


def fill_transitions(replay, steps=100, streams=4):
    """Streams of Atari-like frames with terminations; the first 3 streams wrap their 60-slot
    rings, the last is written for a third of the steps only (its ring partly empty)."""
    rng = np.random.default_rng(1)
    frames = stream_of_frames(rng, 400)
    for step in range(0, steps, 2):
        ids = np.tile(np.arange(streams), 2)
        times = np.repeat([step, step + 1], streams) + ids * 100
        keep = (ids < streams - 1) | (step < steps // 3)
        obs = np.stack([frames[np.maximum(times - 3 + k, ids * 100)] for k in range(4)], axis=1)
        replay.add(ids[keep], obs[keep], ids[keep], rng.random(keep.sum()), rng.random(keep.sum()) < 0.1,
                   np.zeros(keep.sum(), bool))
    return replay


def assert_same_samples(expected_replay, replay, draws=3):
    for seed in range(draws):
        expected, got = expected_replay.sample(64, rng=seed), replay.sample(64, rng=seed)
        for field in ("indices", "generations", "weights", "frames", "actions", "returns", "discounts", "dones"):
            np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)


@pytest.mark.parametrize("store", ["ram", "lz4", "memmap"])
def test_a_loaded_transition_replay_samples_what_the_saved_one_samples(tmp_path, store):
    if store == "lz4":
        pytest.importorskip("lz4")
    options = {"lz4": {"compress": "lz4"}, "memmap": {"memmap_dir": str(tmp_path)}}.get(store, {})
    with fill_transitions(transition_replay(**options)) as saved, transition_replay(seed=9, **options) as fresh:
        drawn = saved.sample(64, rng=5)
        saved.update_priorities(drawn.indices, drawn.generations, np.arange(64) + 0.5)  # priorities of its own
        save_replay(saved, tmp_path / "replay", {"replayed_batches": 7})
        assert load_replay(fresh, tmp_path / "replay") == {"replayed_batches": 7}
        saved.restart_streams(np.arange(4))  # what the load does: the envs start new episodes
        assert fresh.added == saved.added and len(fresh) == len(saved)
        np.testing.assert_array_equal(fresh.priorities(np.arange(240)), saved.priorities(np.arange(240)))
        assert_same_samples(saved, fresh)
        # Its own generator goes on from where the saved one was.
        np.testing.assert_array_equal(fresh.sample(32).indices, saved.sample(32).indices)


def test_a_loaded_replay_continues_its_streams_as_new_episodes(tmp_path):
    """After the load each stream's next record starts an episode, so the windows of the last
    n_step records before the gap, which would read the new episode as their future, are never
    sampled; without the restart (the saved replay, given the same rows) some would be."""
    with fill_transitions(transition_replay()) as saved, transition_replay() as fresh:
        save_replay(saved, tmp_path / "replay")
        load_replay(fresh, tmp_path / "replay")
        written = np.array([fresh.stream_length(s) for s in range(4)])
        last = np.concatenate([s * 60 + (np.arange(written[s] - 2, written[s]) % 60) for s in range(4)])
        reset = np.repeat(stream_of_frames(np.random.default_rng(2), 1)[:, None], 4, axis=1)  # a reset stack
        for replay in (saved, fresh):
            for _ in range(2):
                replay.add(np.arange(4), np.repeat(reset, 4, axis=0), np.zeros(4, np.int64), np.zeros(4),
                           np.zeros(4, bool), np.zeros(4, bool))
        assert saved.sampleable(last).any() and not fresh.sampleable(last).any()
        assert fresh.sample(64, rng=0) is not None


def test_a_sequence_replay_with_recurrent_states_round_trips(tmp_path):
    def build(seed=0):
        return SequenceReplay(ReplayConfig(capacity=64, min_fill=1, alpha=0.6), sequence_length=4, sequence_stride=2,
                              num_streams=2, obs_shape=(3,), obs_dtype=np.float32, seed=seed, state_size=5)

    rng = np.random.default_rng(0)
    with build() as saved, build(seed=3) as fresh:
        for _ in range(25):
            ids = np.array([0, 1])
            saved.add(ids, rng.random((2, 3), dtype=np.float32), rng.integers(0, 4, 2), rng.random(2),
                      rng.random(2) < 0.1, np.zeros(2, bool), rng.random(2), states=rng.random((2, 5)))
        save_replay(saved, tmp_path / "replay")
        load_replay(fresh, tmp_path / "replay")
        saved.restart_streams(np.arange(2))
        for seed in range(3):
            expected, got = saved.sample(8, rng=seed), fresh.sample(8, rng=seed)
            for field in ("indices", "obs", "actions", "behaviour_logp", "rewards", "valid", "initial_state"):
                np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)


@pytest.mark.parametrize("settings, named", [
    ({"capacity": 200}, "capacity 240 (now 200)"),
    ({"n_step": 3}, "horizon 2 (now 3)"),
    ({"alpha": 0.5}, "alpha 0.6 (now 0.5)"),
])
def test_a_replay_of_another_layout_is_refused_before_anything_is_loaded(tmp_path, settings, named):
    with fill_transitions(transition_replay()) as saved, transition_replay(**settings) as other:
        save_replay(saved, tmp_path / "replay")
        with pytest.raises(ReplaySnapshotError, match="saved by a replay of another layout: .*" + re.escape(named)):
            load_replay(other, tmp_path / "replay")
        assert other.added == 0 and len(other) == 0


def test_missing_or_damaged_files_are_refused_in_one_line(tmp_path):
    with fill_transitions(transition_replay()) as saved, transition_replay() as fresh:
        with pytest.raises(ReplaySnapshotError, match="no readable meta.json"):
            load_replay(fresh, tmp_path / "nowhere")
        save_replay(saved, tmp_path / "replay")
        (tmp_path / "replay" / "valid.npy").write_bytes(b"not an array")
        with pytest.raises(ReplaySnapshotError, match="missing or has a damaged array") as refused:
            load_replay(fresh, tmp_path / "replay")
        assert "\n" not in str(refused.value)
        meta = json.loads((tmp_path / "replay" / "meta.json").read_text())
        (tmp_path / "replay" / "meta.json").write_text(json.dumps({**meta, "format": 99}))
        with pytest.raises(ReplaySnapshotError, match="holds replay format 99"):
            load_replay(fresh, tmp_path / "replay")
        assert fresh.added == 0


def test_a_run_keeps_the_newest_checkpoints_replays_only_and_no_partial_save(tmp_path):
    with fill_transitions(transition_replay()) as replay:
        save_replays(tmp_path, 100, {"0": (replay, {})})
        save_replays(tmp_path, 200, {"0": (replay, {}), "1": (replay, {})})
        assert sorted(p.name for p in tmp_path.iterdir()) == [replay_dir(tmp_path, 200).name]
        assert sorted(p.name for p in replay_dir(tmp_path, 200).iterdir()) == ["0", "1"]

        class Failing:  # the disk refuses halfway through
            def __getattr__(self, name):
                if name == "read_frames":
                    raise OSError(28, "No space left on device")
                return getattr(replay, name)

        with pytest.raises(OSError, match="No space left"):
            save_replays(tmp_path, 300, {"0": (Failing(), {})})
        assert sorted(p.name for p in tmp_path.iterdir()) == [replay_dir(tmp_path, 200).name]
        (tmp_path / ".replay_000000000400.tmp").mkdir()  # a save a kill cut short
        remove_partial_replays(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [replay_dir(tmp_path, 200).name]


@pytest.mark.parametrize("mangle", [
    lambda meta: {k: v for k, v in meta.items() if k != "scalars"},
    lambda meta: {**meta, "scalars": {**meta["scalars"], "rng": {"bit_generator": "PCG64", "state": 3}}},
    lambda meta: {**meta, "counters": {"replayed_batches": "many"}},
    lambda meta: [meta],
])
def test_a_meta_json_that_lacks_or_mangles_an_entry_is_refused_before_the_replay_is_touched(tmp_path, mangle):
    with fill_transitions(transition_replay()) as saved, transition_replay() as fresh:
        save_replay(saved, tmp_path / "replay", {"replayed_batches": 3})
        meta = json.loads((tmp_path / "replay" / "meta.json").read_text())
        (tmp_path / "replay" / "meta.json").write_text(json.dumps(mangle(meta)))
        with pytest.raises(ReplaySnapshotError) as refused:
            load_replay(fresh, tmp_path / "replay")
        assert "\n" not in str(refused.value)
        assert fresh.added == 0 and len(fresh) == 0 and fresh.stream_length(0) == 0


def test_a_second_save_at_the_same_env_steps_replaces_the_first_whole(tmp_path):
    """The final checkpoint can fall on the env steps of the last periodic one."""
    with fill_transitions(transition_replay()) as replay, transition_replay() as fresh:
        save_replays(tmp_path, 100, {"0": (replay, {"replayed_batches": 1})})
        save_replays(tmp_path, 100, {"0": (replay, {"replayed_batches": 2})})
        assert sorted(p.name for p in tmp_path.iterdir()) == [replay_dir(tmp_path, 100).name]
        assert load_replay(fresh, replay_dir(tmp_path, 100) / "0") == {"replayed_batches": 2}


def test_a_resume_takes_the_newest_replay_at_or_before_its_checkpoint(tmp_path):
    for steps in (100, 200, 300):
        (replay_dir(tmp_path, steps) / "0").mkdir(parents=True)
    (tmp_path / "replay_notes").mkdir()
    assert newest_saved_replay(tmp_path, 300) == replay_dir(tmp_path, 300)
    assert newest_saved_replay(tmp_path, 250) == replay_dir(tmp_path, 200)
    assert newest_saved_replay(tmp_path, 50) is None
    removed = remove_saved_replays(tmp_path, keep=replay_dir(tmp_path, 200))
    assert sorted(p.name for p in removed) == [replay_dir(tmp_path, 100).name, replay_dir(tmp_path, 300).name]
    assert (tmp_path / "replay_notes").is_dir()  # not a name fastrl writes: left alone


def test_a_replay_the_disk_refuses_is_said_in_one_line_and_the_run_goes_on(tmp_path):
    from types import SimpleNamespace

    from fastrl.learner.runtime import save_run_replays

    class Refusing:
        def __getattr__(self, name):
            if name == "snapshot_arrays":
                raise OSError(28, "No space left on device")
            raise AttributeError(name)

    runtime = SimpleNamespace(learner=SimpleNamespace(replay=Refusing()), policy=0, fed_env_steps=lambda: 10)
    (tmp_path / "checkpoints").mkdir()  # as the checkpoint written first leaves it
    said = []
    assert save_run_replays(tmp_path, 500, [runtime], warn=said.append) is False
    assert len(said) == 1 and "No space left on device" in said[0] and "a save needs room for two replays" in said[0]
    assert not list((tmp_path / "checkpoints").iterdir())


def test_a_save_beats_once_per_file_and_chunk(tmp_path, monkeypatch):
    """The beats a stopping run waits on (fastrl.run.supervisor.stop_processes): one as the save
    begins, one per array file and one per chunk of frames, so a large replay beats all through."""
    import fastrl.replay.snapshot as snapshot

    frame_bytes = 84 * 84  # one uint8 frame; the replay stores single frames
    monkeypatch.setattr(snapshot, "CHUNK_BYTES", 16 * frame_bytes)
    beats = []
    with fill_transitions(transition_replay()) as replay:
        chunks = list(snapshot._chunks(replay, replay.written_ranges()))
        save_replays(tmp_path, 100, {"0": (replay, {})}, beat=lambda: beats.append(1))
        files = len(replay.snapshot_arrays())
    assert len(chunks) > 5 and len(beats) == 1 + files + len(chunks)
