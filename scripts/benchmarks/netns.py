"""Two network namespaces joined by a veth pair: two "nodes" on one machine, for running fastrl's
multi-node command over a real link (root and iproute2's ``ip`` needed).

Each namespace holds one end of the pair, with its own address on a private /24, and its own
loopback; nothing else is reachable from it, so a rank that binds to the wrong interface fails
as it would across two hosts.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass

SUBNET = "10.201.0"


@dataclass(frozen=True)
class Node:
    namespace: str
    interface: str  # its end of the veth pair
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def unavailable() -> str:
    """Why two namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip command"
    return ""


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@contextlib.contextmanager
def two_nodes():
    """Yields (node 0, node 1), joined by a veth pair at SUBNET.1 and SUBNET.2; both namespaces
    (and with them the pair) are deleted on the way out, also after a failure. Names carry this
    process's id, so that concurrent runs do not collide."""
    tag = f"fr{os.getpid()}"
    nodes = [Node(f"{tag}n{k}", f"{tag}v{k}", f"{SUBNET}.{k + 1}") for k in range(2)]
    made = []
    try:
        for node in nodes:
            _ip("netns", "add", node.namespace)
            made.append(node.namespace)
        _ip("link", "add", nodes[0].interface, "type", "veth", "peer", "name", nodes[1].interface)
        for node in nodes:
            _ip("link", "set", node.interface, "netns", node.namespace)
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node.interface)
            _ip("-n", node.namespace, "link", "set", node.interface, "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
        yield nodes[0], nodes[1]
    finally:
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
