"""A free TCP port for a rendezvous or coordinator that another process binds a moment later.

A port from `bind(port 0)` lies in the kernel's ephemeral range, which every outgoing connection on
the machine draws from: between our check and the rendezvous' own bind, a client may take it
(EADDRINUSE, seen under a test suite's load with a local `mjob run`). A port below that range is
never handed to a client, so only another explicit bind can take it.
"""

from __future__ import annotations

import random
import socket

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 10000  # above the well-known and most registered service ports
# Below Kubernetes' default NodePort range (30000-32767): on a host-network pod, kube-proxy's rules
# would send a connection to such a port on the node's address to a Service instead.
HIGHEST = 30000
TRIES = 50


def ephemeral_range(path: str = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on, below the ephemeral and NodePort ranges where
    there is room; otherwise one the kernel picks."""
    top = min(ephemeral_range()[0], HIGHEST)
    if top - LOWEST > TRIES:
        for port in random.sample(range(LOWEST, top), TRIES):
            if _bindable(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
