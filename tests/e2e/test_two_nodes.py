"""Multi-node runs over a real link: the network interface fastrl finds for the collectives, and
two "nodes" (network namespaces joined by a veth pair, scripts/benchmarks/netns.py) running the
README's two-node command."""
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fastrl.distributed.process_group import (
    SOCKET_INTERFACE_VARS,
    InterfaceError,
    interface_to,
    route_collectives_to_master,
)
from fastrl.files.checkpoint import list_checkpoints, load_checkpoint
from tests.support.scripts import load_benchmark

netns = load_benchmark("netns")
BIN = Path(sys.executable).parent  # torchrun and fastrl-train, as installed beside this interpreter
needs_namespaces = pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or "")


def a_local_address() -> tuple[str, str]:
    """(interface, IPv4 address) of this host's first interface that is up and not loopback."""
    stats = psutil.net_if_stats()
    for name, addresses in psutil.net_if_addrs().items():
        for a in addresses:
            if (a.family == socket.AF_INET and stats.get(name) and stats[name].isup
                    and not ipaddress.ip_address(a.address).is_loopback):
                return name, a.address
    pytest.skip("this host has no network interface up besides loopback")


def test_the_interface_is_the_one_holding_the_address_that_reaches_the_master():
    name, address = a_local_address()
    assert interface_to(address) == name
    assert interface_to("127.0.0.1") is None and interface_to("localhost") is None


def test_every_address_of_the_master_is_tried_until_one_routes(monkeypatch):
    name, address = a_local_address()
    # An IPv6 address listed first that has no route (a link-local one on no interface of this
    # host), then the IPv4 address that is reachable.
    unroutable = (socket.AF_INET6, socket.SOCK_DGRAM, 17, "", ("fe80::1", 9, 0, 987654))
    reachable = (socket.AF_INET, socket.SOCK_DGRAM, 17, "", (address, 9))
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [unroutable, reachable])
    assert interface_to("master.example") == name
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [unroutable])
    with pytest.raises(InterfaceError, match="no network interface of this host reaches MASTER_ADDR master.example"):
        interface_to("master.example")


def test_unset_socket_variables_are_set_to_that_interface_and_the_users_are_kept(monkeypatch):
    name, address = a_local_address()
    monkeypatch.setenv("MASTER_ADDR", address)
    for var in SOCKET_INTERFACE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert route_collectives_to_master() == f"GLOO_SOCKET_IFNAME={name}, NCCL_SOCKET_IFNAME=={name}"
    # NCCL takes its variable as a prefix unless it starts with "=": eth1 would take eth10 too
    assert os.environ["GLOO_SOCKET_IFNAME"] == name and os.environ["NCCL_SOCKET_IFNAME"] == "=" + name

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine0")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    assert route_collectives_to_master() == f"NCCL_SOCKET_IFNAME=={name}"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"
    assert route_collectives_to_master() == ""  # both set: nothing to choose


def test_a_loopback_master_sets_nothing(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for var in SOCKET_INTERFACE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert route_collectives_to_master() == ""
    assert not any(var in os.environ for var in SOCKET_INTERFACE_VARS)


def without_socket_variables() -> dict:
    return {k: v for k, v in os.environ.items() if k not in SOCKET_INTERFACE_VARS}


@needs_namespaces
def test_a_master_no_interface_reaches_is_refused_in_one_line_naming_the_variable(tmp_path):
    # Node 1 reaches 10.201.0.0/24 only: a master elsewhere has no route, whatever gloo would try.
    env = {**without_socket_variables(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "10.202.0.1", "MASTER_PORT": "29500"}
    with netns.two_nodes() as (_, node1):
        out = subprocess.run(node1.command([sys.executable, "-m", "fastrl.cli", "--profile", "cartpole-appo",
                                            "--run-dir", str(tmp_path / "run"), "--set", "device=cpu"]),
                             env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip()
    assert "\n" not in line and "MASTER_ADDR 10.202.0.1" in line and "GLOO_SOCKET_IFNAME" in line, line
    assert not (tmp_path / "run" / "config.toml").exists()  # refused before the run began


def two_node_command(rank: int, master: str, run_dir: Path) -> list[str]:
    """The README's two-node command for node ``rank``, with budgets a test can afford."""
    return [str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
            "--master-addr", master, "--master-port", "29500",
            "--no-python", str(BIN / "fastrl-train"), "--profile", "cartpole-appo", "--run-dir", str(run_dir),
            "--quiet",
            "--train-for-env-steps", "20000", "--set", "device=cpu", "--set", "env.num_workers=1",
            "--set", "env.envs_per_worker=64", "--set", "learner.batch_size=1024", "--set", "report_every_s=1",
            "--set", "dist_timeout_s=60"]


@needs_namespaces
def test_two_nodes_over_a_veth_link_find_their_interface_train_and_agree_on_parameters(tmp_path):
    run_dir = tmp_path / "run"
    with netns.two_nodes() as nodes:
        # A session of its own per node: on a timeout the whole torchrun tree is killed.
        procs = [subprocess.Popen(node.command(two_node_command(k, nodes[0].address, run_dir)),
                                  env=without_socket_variables(), stdout=subprocess.DEVNULL,
                                  stderr=open(tmp_path / f"node{k}.log", "w"), start_new_session=True)
                 for k, node in enumerate(nodes)]
        try:
            codes = [p.wait(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    logs = [(tmp_path / f"node{k}.log").read_text() for k in range(2)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    for k, (node, log) in enumerate(zip(nodes, logs)):
        assert (f"[fastrl] rank {k}: GLOO_SOCKET_IFNAME={node.interface}, NCCL_SOCKET_IFNAME=={node.interface}, "
                f"the interface that reaches MASTER_ADDR {nodes[0].address}") in log, log[-3000:]

    state = load_checkpoint(list_checkpoints(run_dir)[-1])
    assert state["world_size"] == 2
    digests = state["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1], digests  # bit-identical parameters
    assert state["learner"]["updates"] > 0
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["world_size"] == 2 and final["env_steps"] >= 20_000
    assert all(steps > 0 for steps in final["env_steps_per_rank"])  # both nodes stepped their envs
