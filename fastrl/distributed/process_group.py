"""torch.distributed glue: data-parallel learners and rank-0 metrics, launched by torchrun.

Each rank (one per GPU, or per process on CPU) runs the whole single-node trainer: rollout
workers, inference batcher and learner. Two process groups share torchrun's store under
different prefixes:

- ``learner``: the learner processes. Every learner step starts with an all-reduce of a stop
  flag (so all ranks stop after the same update, never leaving a peer inside a collective), and
  every update all-reduces one flat gradient buffer, averaged, plus a non-finite flag so that
  all ranks skip the same updates. A replay learner first all-reduces its plan for the batch
  (whether any rank dropped it, how many gradient steps every rank can take), so that all ranks
  make the same number of gradient all-reduces. Parameters start from rank 0's and stay
  bit-identical. With ``learner.normalize_returns`` every batch also all-gathers each rank's
  return moments (count, mean, M2), merged in rank order, so that all ranks scale rewards alike
  and their averaged gradients are of targets in the same units.
- ``runner``: the runner processes. Every report all-gathers the counters; rank 0 writes
  metrics.jsonl (env steps and FPS summed, returns averaged over episodes) and checkpoints.

A collective that waits longer than ``dist_timeout_s`` raises, so a dead rank ends the others'
runs with an error instead of a hang (fastrl.run.rank_heartbeat names the rank); torchrun then stops the
job, or under ``--max-restarts`` starts the group again (fastrl.run.elastic), each attempt's keys in
the store under their own prefix (attempt_prefix).

Only tensors travel between ranks (no pickled objects), but torch's TCPStore listens on every
interface of the rank-0 host and trusts whoever connects: run multi-node jobs on a trusted network.
"""
from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import psutil
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # ranks on this node
    # the socket variables fastrl set ("GLOO_SOCKET_IFNAME=eth1, ...", route_collectives_to_master);
    # "" when the user's own or a loopback master decide
    pinned_sockets: str = ""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "DistInfo":
        """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (absent: a single process)."""
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


# The variables that pin gloo's and NCCL's sockets to one network interface. Unset, each library
# takes the address this host's name resolves to, which on a multi-homed node (or in a network
# namespace) can be one the other nodes cannot reach: the ranks then never connect.
SOCKET_INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class InterfaceError(RuntimeError):
    """No network interface of this host reaches the master address; the message names the fix."""


def interface_to(addr: str) -> str | None:
    """The name of this host's network interface whose address the kernel would send from to reach
    ``addr`` (a host name or IP address); None when that is a loopback address (every rank on this
    host)."""
    try:
        family, source = _route_source(addr)
    except OSError as exc:
        raise InterfaceError(f"no network interface of this host reaches MASTER_ADDR {addr} "
                             f"({exc.strerror or exc}): check the address, or set {' / '.join(SOCKET_INTERFACE_VARS)} "
                             f"to the interface to use") from None
    if source.is_loopback:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == family and ipaddress.ip_address(a.address.split("%")[0]) == source for a in addresses):
            return name
    raise InterfaceError(f"the address {source} that reaches MASTER_ADDR {addr} belongs to no network interface: "
                         f"set {' / '.join(SOCKET_INTERFACE_VARS)} to the interface to use")


def _route_source(addr: str) -> tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """(address family, source address) that the kernel would send from to reach ``addr``: a UDP
    ``connect`` picks the route and source without sending anything. Each address ``addr``
    resolves to is tried in turn (a name whose IPv6 address comes first may have no IPv6 route
    where its IPv4 one is reachable); the last OSError when none routes."""
    failure = None
    for family, kind, proto, _, target in socket.getaddrinfo(addr, 9, type=socket.SOCK_DGRAM):
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(target)
                return family, ipaddress.ip_address(probe.getsockname()[0].split("%")[0])
        except OSError as exc:
            failure = exc
    raise failure


def route_collectives_to_master() -> str:
    """Pin the collectives' sockets to the interface that reaches ``MASTER_ADDR``: each of
    SOCKET_INTERFACE_VARS that is unset is set to it in this process's environment, which the
    run's processes inherit. Returns what was set ("GLOO_SOCKET_IFNAME=eth1, ..."), "" when
    nothing was (every variable set already, or a loopback master)."""
    unset = [var for var in SOCKET_INTERFACE_VARS if not os.environ.get(var)]
    interface = interface_to(os.environ.get("MASTER_ADDR", "127.0.0.1")) if unset else None
    if interface is None:
        return ""
    # NCCL reads its variable as a name prefix (eth1 would take eth10 too); "=" asks for this one.
    values = {var: "=" + interface if var.startswith("NCCL") else interface for var in unset}
    os.environ.update(values)
    return ", ".join(f"{var}={value}" for var, value in values.items())


def init_group(info: DistInfo, role: str, device: str, timeout_s: float) -> None:
    """Join the process group of ``role`` ("learner" or "runner") through torchrun's store."""
    # Under torchrun the agent hosts the store; launched by hand, rank 0's runner hosts it (its
    # learner, a child process on the same port, connects as a client).
    host = info.rank == 0 and role == "runner" and not uses_agent_store()
    store = connect_store(info.world_size, host, timeout_s)
    backend = "nccl" if device.startswith("cuda") and role == "learner" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore(attempt_prefix(role), store), rank=info.rank,
                            world_size=info.world_size, timeout=timedelta(seconds=timeout_s))


def connect_store(world_size: int, host: bool, timeout_s: float) -> dist.TCPStore:
    """The TCPStore at MASTER_ADDR:MASTER_PORT (hosted by this process when ``host``)."""
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    return dist.TCPStore(addr, port, world_size, is_master=host, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def tell_other_ranks(info: DistInfo, name: str, value: str, timeout_s: float) -> None:
    """Rank 0: ``value`` under ``name`` in torchrun's store, for this attempt's other ranks
    (:func:`hear_from_rank_0`). Only with the agent's store: a hand launch has none yet."""
    connect_store(info.world_size, False, timeout_s).set(attempt_prefix(name), value)


def hear_from_rank_0(info: DistInfo, name: str, timeout_s: float) -> str:
    """What rank 0 put under ``name`` for this attempt (:func:`tell_other_ranks`), waiting up to
    ``timeout_s`` for it; RuntimeError (torch's DistError) when it never does."""
    return connect_store(info.world_size, False, timeout_s).get(attempt_prefix(name)).decode()


def uses_agent_store() -> bool:
    """Whether torchrun's agent hosts the store (it does with its static and c10d rendezvous). That
    store outlives the attempts of an elastic job, so a dead attempt's keys are still there (see
    attempt_prefix)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def restart_count() -> int:
    """Which restart of its torchrun job this process belongs to (0: the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


def attempt_prefix(name: str) -> str:
    """``name``'s keys in the store for this attempt: a restarted group must not read the dead
    attempt's addresses and barrier counts, which the agent's store still holds."""
    return f"fastrl/attempt_{restart_count()}/{name}"


# What the learner says when a collective failed under it (fastrl.learner.process), so that the
# runner knows to ask its rank watch (fastrl.run.rank_heartbeat) who went away.
PEER_FAILURE = "a collective with the other ranks failed"


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer went away: a reset connection
    (its process died) or a timeout (its host is gone). gloo raises both as plain RuntimeErrors
    whose text names its sources; NCCL and the store raise torch's DistError."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "/gloo/" in str(exc))


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Every rank starts from rank 0's weights (and buffers)."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=0)


def join_data_parallel(learner, world_size: int) -> None:
    """Make ``learner`` (a :class:`fastrl.learner.base.BaseLearner`, group joined) one of
    ``world_size`` data-parallel ranks: rank 0's weights on every rank, gradients averaged, and
    return-normalization moments pooled over the ranks."""
    broadcast_parameters(learner.model)
    learner.grad_sync = GradientAverager(learner.model, world_size)
    return_scale = getattr(learner, "return_scale", None)
    if return_scale is not None:
        return_scale.gather = functools.partial(gather_counters, device=learner.device)


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Rank 0's buffers (e.g. observation statistics) to every rank."""
    for tensor in module.buffers():
        dist.broadcast(tensor.data, src=0)


def max_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """The element-wise maximum of every rank's ``values``, in one float64 all-reduce (exact for
    flags and for integers below 2**53)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def agree(local_stop: bool, local_progress: float, device: torch.device) -> tuple[bool, float]:
    """(any rank wants to stop, the furthest training progress): the same on every rank, so all
    ranks stop after the same update and step with the same learning rate."""
    stop, progress = max_over_ranks([float(local_stop), local_progress], device)
    return stop > 0, progress


class GradientAverager:
    """Averages gradients across ranks in one flat all-reduce; returns whether every rank's
    gradients were finite (if not, all ranks skip the update). ``agree_steps`` makes a replay
    learner's plan for a batch common to all ranks."""

    def __init__(self, model: torch.nn.Module, world_size: int):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.world_size = world_size
        numel = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(numel + 1, device=self.params[0].device)

    def __call__(self, local_finite: bool) -> bool:
        offset = 0
        for p in self.params:
            n = p.numel()
            if local_finite and p.grad is not None:
                self.flat[offset:offset + n].copy_(p.grad.reshape(-1))
            else:
                self.flat[offset:offset + n].zero_()
            offset += n
        self.flat[-1] = 0.0 if local_finite else 1.0
        dist.all_reduce(self.flat)
        if self.flat[-1].item() > 0:
            return False
        self.flat[:-1].div_(self.world_size)
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(self.flat[offset:offset + n].view_as(p))
            offset += n
        return True

    def agree_steps(self, local_drop: bool, local_steps: int) -> tuple[bool, int]:
        """(any rank dropped its batch, the fewest gradient steps any rank may take), in one
        all-reduce. Each rank fills its own replay, so their replay ratios can allow different
        step counts, and a rank that drops a non-finite batch takes none: left to themselves they
        would make different numbers of gradient all-reduces and the surplus would wait forever."""
        drop, negated_steps = max_over_ranks([float(local_drop), -float(local_steps)], self.flat.device)
        return drop > 0, int(-negated_steps)


def parameter_digest(model: torch.nn.Module) -> str:
    """A hash of the exact parameter bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def gather_digests(model: torch.nn.Module) -> list[str]:
    """Every rank's parameter digest. Sent as one int64 tensor, never as a pickled object:
    all_gather_object would unpickle whatever a peer sends."""
    device = next(model.parameters()).device
    local = torch.tensor([int.from_bytes(bytes.fromhex(parameter_digest(model)), "big", signed=True)],
                         dtype=torch.int64, device=device)
    out = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return [int(t.item()).to_bytes(8, "big", signed=True).hex() for t in out]


def gather_counters(local: np.ndarray, device: torch.device | str = "cpu") -> np.ndarray:
    """All ranks' float64 vectors (counters, statistics), ``[world_size, len(local)]``; ``device``:
    where the group's backend takes tensors (NCCL: this rank's GPU)."""
    tensor = torch.from_numpy(np.ascontiguousarray(local, dtype=np.float64)).to(device)
    out = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor)
    return torch.stack(out).cpu().numpy()
