"""scripts/bench.py scaling without training: the torchrun commands of one node and of two
"nodes" (the README's two-node command in each namespace), the link chosen, one-line refusals."""
import pytest

from tests.support.scripts import load_benchmark

bench = load_benchmark("scaling")
netns = load_benchmark("netns")


def test_two_nodes_run_the_readme_command_with_half_the_ranks_each_and_one_master():
    nodes = (netns.Node("ns0", "v0", "10.201.0.1"), netns.Node("ns1", "v1", "10.201.0.2"))
    commands = bench.torchrun_commands(4, nodes, ["-m", "fastrl.cli", "--quiet"])
    assert len(commands) == 2
    ports = set()
    for k, cmd in enumerate(commands):
        assert cmd[:4] == ["ip", "netns", "exec", f"ns{k}"]
        options = dict(zip(cmd[7:17:2], cmd[8:17:2]))
        assert options == {"--nnodes": "2", "--node-rank": str(k), "--nproc-per-node": "2",
                           "--master-addr": "10.201.0.1", "--master-port": options["--master-port"]}
        assert cmd[-3:] == ["-m", "fastrl.cli", "--quiet"]
        ports.add(options["--master-port"])
    assert len(ports) == 1  # both nodes meet at node 0's address and one port


def test_one_node_runs_every_rank_under_one_torchrun():
    (cmd,) = bench.torchrun_commands(3, None, ["-m", "fastrl.cli"])
    assert cmd[cmd.index("--nproc-per-node") + 1] == "3" and "--nnodes" not in cmd


def test_the_link_is_veth_where_namespaces_can_be_made_and_the_ranks_split_evenly(monkeypatch):
    monkeypatch.setattr(netns, "unavailable", lambda: "")
    assert bench.chosen_link("auto", 2) == "veth"
    assert bench.chosen_link("auto", 3) == "loopback"
    with pytest.raises(bench.ScalingError, match="--ranks must be even, got 3"):
        bench.chosen_link("veth", 3)
    monkeypatch.setattr(netns, "unavailable", lambda: "network namespaces need root")
    assert bench.chosen_link("auto", 2) == "loopback"
    with pytest.raises(bench.ScalingError, match="need root; use --link loopback"):
        bench.chosen_link("veth", 2)

