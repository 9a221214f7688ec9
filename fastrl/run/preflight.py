"""The checks before anything starts: what the user can get wrong is found before any process
starts (and before ``overwrite`` deletes anything) and raised as one line that says what to do
(RunError, or ConfigError from the config); what the checks settle is the run's RunPlan."""
from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import torch

from ..config import Config, ConfigError, to_toml, validate, weights_mismatch
from ..distributed.process_group import (
    DistInfo,
    InterfaceError,
    hear_from_rank_0,
    route_collectives_to_master,
    tell_other_ranks,
    uses_agent_store,
)
from ..envs import EnvSpec, probe_env
from ..envs.multiagent.pettingzoo_backend import require_pettingzoo
from ..envs.spaces import ActionLayout, ObsLayout
from ..evaluation.evaluator import check_run_opponents
from ..evaluation.video import require_video_extra
from ..files.checkpoint import (
    CheckpointError,
    CheckpointMismatch,
    checkpoint_dir,
    load_checkpoint,
    load_latest_checkpoint,
    load_model_state,
    remove_partial_checkpoints,
    set_aside_newer_checkpoints,
)
from ..files.run_dir import RunDirError, RunDirLock, check_run_dir, prepare_run_dir, write_atomic
from ..ipc.arena import remove_stale_segments, trajectory_layout
from ..learner.policy_set import checkpoint_policies
from ..models.heads import discrete_actions
from ..models.networks import build_model, keys_it_ignores, num_state_values, state_bytes
from ..multiagent.league import prepare_league, require_rating_library
from ..multiagent.policy_map import PolicyMap, check_policy_spaces, check_slots_per_policy, policy_map
from ..replay.snapshot import remove_partial_replays
from ..reporting.wandb_logger import require_wandb
from .main_guard import unguarded_main_call
from .plan import RunError, RunPlan
from .resources import ResourceError, check_resources, model_memory_error


def check_request(cfg: Config, run_dir: Path | None, resume: bool) -> DistInfo:
    """The config, the extras it needs, and what the launch asks for; returns this rank's DistInfo."""
    validate(cfg)
    if cfg.logging.wandb:
        require_wandb()
    if cfg.eval.video_every_s:
        require_video_extra()
    if cfg.selfplay.enabled:
        require_rating_library()
    require_pettingzoo(cfg.env.id)
    dist_info = DistInfo.from_env()
    if dist_info.enabled and (run_dir is None or cfg.serial):
        raise RunError("a torchrun launch needs --run-dir DIR (the same on every rank) and no serial mode")
    if dist_info.enabled and cfg.pbt.population:
        raise RunError("pbt.population trains its members on one node; a torchrun launch is not supported with "
                       "it yet: run it without torchrun")
    if dist_info.enabled and cfg.learner.algo == "sac":
        raise RunError("learner.algo=sac trains one learner on one replay; a torchrun launch is not supported with "
                       "it: run it without torchrun")
    if dist_info.enabled and cfg.replay.checkpoint:
        raise RunError("replay.checkpoint saves one process's replay, and under torchrun each rank keeps its own: "
                       "set replay.checkpoint=false")
    if resume and run_dir is None:
        raise RunError("resume needs the run directory of the run to continue (--run-dir DIR)")
    if dist_info.enabled and resume and not uses_agent_store():
        raise RunError("a --resume with several ranks needs torchrun's store, through which rank 0 tells the other "
                       "ranks which checkpoint it resumes: launch it with torchrun (static or c10d rendezvous)")
    if dist_info.enabled:
        try:
            dist_info = dataclasses.replace(dist_info, pinned_sockets=route_collectives_to_master())
        except InterfaceError as exc:
            raise RunError(str(exc)) from None
    unguarded = None if cfg.serial else unguarded_main_call()
    if unguarded:
        raise RunError(f"fastrl.train() is called at the top level of {unguarded}, outside `if __name__ == "
                       f"\"__main__\":`, and every process fastrl starts re-runs that script: put the call under "
                       f"that guard")
    return dist_info


def lock_run_dir(run_dir: Path | None, resume: bool, overwrite: bool, dist_info: DistInfo) -> RunDirLock | None:
    """The checked and locked run directory (fastrl.files.run_dir.check_run_dir); None without one."""
    if run_dir is None:
        return None
    try:
        return check_run_dir(run_dir, resume, overwrite, dist_info.is_main)
    except RunDirError as exc:
        raise RunError(str(exc)) from None


def plan_run(cfg: Config, run_dir: Path | None, resume: bool, overwrite: bool, model: torch.nn.Module | None,
             launched_at: float, dist_info: DistInfo, lock: RunDirLock | None) -> RunPlan:
    """The remaining checks once the run directory is locked (devices, env, model, checkpoint to
    resume, memory), then the run directory made ready and its config.toml written."""
    try:
        device = resolve_device(cfg.device, dist_info)
        inference_device = resolve_device(cfg.inference.device, dist_info) if cfg.inference.device else device
        spec = probe_env(cfg)
        policies = run_policies(cfg, spec)
        check_run_opponents(cfg, spec)
        check_action_regularizer(cfg, spec)
        shape = model_shape(cfg, spec, model)
        layout = arena_layout(cfg, spec, num_state_values(shape), getattr(shape, "state_size", 0))
        remove_stale_segments()  # a killed run's arena must not count against /dev/shm
        check_resources(cfg, layout.nbytes, spec.observation_space, dist_info.local_world_size,
                        shared=not cfg.serial, model_bytes=state_bytes(shape),
                        learner_on_cpu=torch.device(device).type == "cpu", num_policies=policies.num_policies)
        template = shape if model is not None else build_template(cfg, spec)
        resume_state = load_resume_state(run_dir, cfg, template, policies.names, dist_info) if resume else None
        if cfg.selfplay.enabled and run_dir is not None and dist_info.is_main:
            prepare_league(run_dir, resume_state["learner"]["version"] if resume else None, num_state_values(shape))
        config_text = to_toml(cfg)
        if run_dir is not None and dist_info.is_main:
            prepare_run_dir(run_dir, resume, overwrite)
            write_atomic(run_dir / "config.toml", config_text)
    except (RunDirError, ResourceError, CheckpointError) as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:
        raise RunError(f"cannot write {exc.filename or run_dir}: {exc.strerror or exc}") from None
    return RunPlan(cfg, run_dir, spec, layout, model, device, inference_device, resume_state, launched_at, dist_info,
                   lock, policies)


def run_policies(cfg: Config, spec: EnvSpec) -> PolicyMap:
    """The run's policies over the env's agents (ConfigError: a mapping or self-play that cannot work here)."""
    policies = policy_map(cfg, spec.agents)
    check_policy_spaces(cfg.env.id, policies, spec.agent_spaces)
    check_slots_per_policy(cfg, policies.num_policies)
    games = cfg.env.envs_per_worker // max(len(spec.agents), 1)
    if cfg.pbt.population > games:
        raise ConfigError(f"pbt.population={cfg.pbt.population} members share each worker's {games} games: give "
                          f"every member some, env.envs_per_worker >= {cfg.pbt.population * max(len(spec.agents), 1)}")
    if cfg.selfplay.enabled and len(spec.agents) < 2:
        raise ConfigError(f"selfplay.enabled needs a multi-agent env (a game with seats to share out), and "
                          f"{cfg.env.id!r} has one agent: set selfplay.enabled=false")
    return policies


def check_action_regularizer(cfg: Config, spec: EnvSpec) -> None:
    """ConfigError (one line) for learner.uniform_kl_coef where the actions have a continuous part."""
    if cfg.learner.uniform_kl_coef > 0 and not discrete_actions(spec.action_space):
        raise ConfigError(f"learner.uniform_kl_coef={cfg.learner.uniform_kl_coef:g} is a KL to the uniform policy "
                          f"over discrete actions, and {cfg.env.id!r} acts in {spec.action_space}: set "
                          f"learner.uniform_kl_coef=0")


def model_shape(cfg: Config, spec: EnvSpec, model: torch.nn.Module | None) -> torch.nn.Module:
    """The run's network with its parameters on torch's meta device (sizes, no memory), so that
    the resource check can refuse one too large before it is built; a user's model as given."""
    if model is not None:
        return build_model(spec.observation_space, spec.action_space, cfg.model, model, cfg.learner.algo)
    with torch.device("meta"):
        return build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)


def build_template(cfg: Config, spec: EnvSpec) -> torch.nn.Module:
    """The network in memory (to check a checkpoint against). An allocation that fails all the
    same (memory taken since the check) is the resource check's one-line error, not a traceback."""
    try:
        return build_model(spec.observation_space, spec.action_space, cfg.model, None, cfg.learner.algo)
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and "can't allocate memory" not in str(exc):
            raise
        raise model_memory_error(cfg, exc) from None


def resolve_device(name: str, dist_info: DistInfo = DistInfo()) -> str:
    """The config's ``device`` for this rank: ``auto`` -> ``cuda`` if a GPU is visible, else the
    CPU; ``cuda`` -> the rank's own GPU, ``cuda:LOCAL_RANK`` (``cuda:0`` where the launcher lets
    each rank see one GPU); ``cuda:N`` as given, in a single process. Raises RunError where ranks
    would share a GPU (NCCL refuses a group with a duplicate GPU)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not name.startswith("cuda"):
        return name
    if not torch.cuda.is_available():
        raise RunError(f"device={name} asked for but CUDA is not available; use --set device=cpu")
    count = torch.cuda.device_count()
    if name != "cuda":
        if dist_info.enabled:
            raise RunError(f"device='{name}' under torchrun (WORLD_SIZE={dist_info.world_size}) would put every "
                           f"rank on one GPU; use device='cuda' (each rank takes cuda:LOCAL_RANK)")
        if torch.device(name).index >= count:
            raise RunError(f"device='{name}' but {count} GPU(s) are visible (cuda:0 to cuda:{count - 1}); pick one "
                           f"of those, or check CUDA_VISIBLE_DEVICES")
        return name
    ranks_here = max(dist_info.local_world_size, dist_info.local_rank + 1)
    if count == 1:
        # With CUDA_VISIBLE_DEVICES set, a launcher may give each rank its own GPU; unset, every
        # rank sees the node's only GPU.
        if ranks_here > 1 and not os.environ.get("CUDA_VISIBLE_DEVICES"):
            raise RunError(f"torchrun runs {ranks_here} ranks on this node, which has one GPU: they would share "
                           f"it; use --nproc-per-node 1, or device=cpu")
        return "cuda:0"
    if ranks_here > count:
        raise RunError(f"torchrun runs {ranks_here} ranks on this node but {count} GPUs are visible, so LOCAL_RANK "
                       f"{dist_info.local_rank} has no GPU of its own; use --nproc-per-node {count} (or fewer), or "
                       f"device=cpu")
    return f"cuda:{dist_info.local_rank}"


def arena_layout(cfg: Config, spec: EnvSpec, num_weights: int, state_size: int = 0):
    """The run's arena; ``state_size`` > 0 adds the recurrent state arrays (model.core); a weight
    set per policy, and per league snapshot with self-play."""
    obs, act = ObsLayout(spec.observation_space), ActionLayout(spec.action_space)
    return trajectory_layout(
        num_slots=cfg.num_slots, rollout=cfg.learner.rollout, obs_shape=obs.storage_shape,
        obs_dtype=obs.storage_dtype, action_shape=act.shape, action_dtype=act.dtype, num_workers=cfg.env.num_workers,
        envs_per_worker=cfg.env.envs_per_worker, num_splits=cfg.env.num_splits, num_weights=num_weights,
        state_size=state_size, num_policies=policy_map(cfg, spec.agents).num_policies,
        num_snapshots=cfg.selfplay.max_snapshots if cfg.selfplay.enabled else 0, num_info_keys=len(cfg.info_keys))


def load_resume_state(run_dir: Path, cfg: Config, template: torch.nn.Module, policies: tuple[str, ...],
                      dist_info: DistInfo = DistInfo()) -> dict:
    """The newest checkpoint of ``run_dir`` that fits ``cfg``, ``template`` (checked on a copy) and
    the run's ``policies`` (their names, fastrl.multiagent.policy_map).

    Only rank 0 chooses it and cleans the checkpoints (partial saves removed, newer unusable ones
    set aside), under the run directory's lock; it tells the other ranks its choice through
    torchrun's store and they load that file. Left to choose for themselves on a shared file
    system, ranks would rename and delete the same files and could resume different checkpoints."""
    probe = copy.deepcopy(template)

    def check(state: dict) -> None:
        differs = weights_mismatch(state.get("config", {}), cfg, keys_it_ignores(template))
        if differs:
            raise CheckpointMismatch(f"--resume: the run in '{run_dir}' was trained with other settings ({differs}); "
                                     f"drop those overrides to continue it, or start a new run with another --run-dir")
        lacking = checkpoint_policies(state, policies, cfg.pbt.population)
        if lacking:
            raise CheckpointMismatch(f"--resume: the run in '{run_dir}' {lacking}, or start a new run with another "
                                     f"--run-dir")
        load_model_state(probe, state)

    if not dist_info.is_main:
        return load_chosen_checkpoint(run_dir, check, dist_info, cfg.dist_timeout_s)
    remove_partial_checkpoints(run_dir)
    remove_partial_replays(checkpoint_dir(run_dir))
    try:
        path, state = load_latest_checkpoint(run_dir, check=check)
    except CheckpointError:
        if dist_info.enabled:
            _tell_resumed(dist_info, "", cfg.dist_timeout_s)  # so that they stop now, not after dist_timeout_s
        raise
    set_aside_newer_checkpoints(run_dir, path)
    if dist_info.enabled:
        _tell_resumed(dist_info, path.name, cfg.dist_timeout_s)
    return state


RESUME_KEY = "resume_checkpoint"  # in torchrun's store: the checkpoint rank 0 resumes ("" for none)


def _tell_resumed(dist_info: DistInfo, name: str, timeout_s: float) -> None:
    try:
        tell_other_ranks(dist_info, RESUME_KEY, name, timeout_s)
    except RuntimeError as exc:  # DistNetworkError: the store's host is gone
        raise RunError(f"--resume: cannot tell the other ranks which checkpoint to resume through torchrun's store "
                       f"({str(exc).splitlines()[0][:200]})") from None


def load_chosen_checkpoint(run_dir: Path, check, dist_info: DistInfo, timeout_s: float) -> dict:
    """A rank other than 0: the checkpoint rank 0 chose, checked with ``check``; nothing renamed or removed."""
    try:
        name = hear_from_rank_0(dist_info, RESUME_KEY, timeout_s)
    except RuntimeError:  # DistStoreError: rank 0 never said (it failed before choosing, or is not there)
        raise RunError(f"--resume: rank 0 did not say within dist_timeout_s ({timeout_s:g} s) which checkpoint to "
                       f"resume; see rank 0's error") from None
    if not name:
        raise RunError("--resume: rank 0 found no checkpoint to resume; see rank 0's error")
    path = checkpoint_dir(run_dir) / name
    if not path.is_file():
        raise RunError(f"--resume: rank 0 resumes {name}, which rank {dist_info.rank} does not find in "
                       f"'{checkpoint_dir(run_dir)}': put --run-dir on a file system that every rank shares")
    state = load_checkpoint(path)
    check(state)
    return state
