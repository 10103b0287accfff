"""Real nodes for the local cluster: network namespaces, containerd, kubelet, CNI, CoreDNS.

`cluster up --real-nodes N` calls `start()`; `down` calls `teardown()`. The layout (every address
lives inside namespaces created here; the root namespace gets no interface, route or NAT):

    root netns:  kube-apiserver 127.0.0.1:<port>   netns-forward (listens in the fabric netns)
    <id>-fabric: br0 10.249.0.1/24; lo 10.96.0.1 (API forwarder :443), 10.96.0.10 (CoreDNS :53)
                 routes 10.244.<i>.0/24 via 10.249.0.<10+i>
    <id>-n<i>:   eth0 10.249.0.<10+i>/24 (veth to br0), default via 10.249.0.1;
                 containerd + kubelet; CNI bridge cni0 10.244.<i>.1/24 for its pods

Python standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nodeseed
from common import die, log

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
FABRIC_NET = "10.249.0"
FABRIC_GATEWAY = f"{FABRIC_NET}.1"
API_SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's ClusterIP (first of 10.96.0.0/16)
DNS_SERVICE_IP = "10.96.0.10"
SERVICE_CIDR = "10.96.0.0/16"
REAL_NODE_LABEL = "megatron.dev/test-node"
NETNS_DIR = Path("/var/run/netns")
CONTAINERD_NS = "k8s.io"  # the containerd namespace the CRI plugin uses


def node_ip(i: int) -> str:
    return f"{FABRIC_NET}.{10 + i}"


def pod_cidr(i: int) -> str:
    return f"10.244.{i}.0/24"


def egress_socket(state: Path) -> Path:
    """The API server's HTTP CONNECT proxy into the fabric namespace (see netns-forward)."""
    return state / "cluster-egress.sock"


def cluster_id(state: Path) -> str:
    """A short id from the state directory: names of namespaces and links stay unique when
    several clusters run on one machine."""
    return "mo" + hashlib.sha256(str(state).encode()).hexdigest()[:6]


@dataclass(frozen=True)
class RealNode:
    index: int
    name: str
    netns: str
    root: Path  # DIR/nodes/<name>

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def pod_cidr(self) -> str:
        return pod_cidr(self.index)

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/{self.netns}"

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "netns": self.netns,
            "ip": self.ip,
            "pod_cidr": self.pod_cidr,
            "containerd_socket": str(self.socket),
            "cgroup_root": self.cgroup_root,
            "dir": str(self.root),
        }


def plan(state: Path, count: int) -> tuple[str, list[RealNode]]:
    cid = cluster_id(state)
    nodes = [
        RealNode(i, f"real-node-{i}", f"{cid}-n{i}", state / "nodes" / f"real-node-{i}")
        for i in range(count)
    ]
    return f"{cid}-fabric", nodes


def sh(argv: Sequence[str], what: str, check: bool = True) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        die(f"{what} failed: `{' '.join(argv)}`: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """Only the network namespace changes (unlike `ip netns exec`, which also makes a new mount
    namespace): the kubelet's volume mounts must be seen by containerd and runc."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


# The kubelet sets these host-wide kernel settings at start (container manager setupNode, unless
# protectKernelDefaults, which makes it refuse to start instead). They are not per namespace, so
# `up` records the values it found and `down` puts them back.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def read_sysctls() -> dict[str, str]:
    out = {}
    for key in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[key] = (Path("/proc/sys") / key).read_text().strip()
    return out


def restore_sysctls(saved: dict[str, str]) -> None:
    for key, value in saved.items():
        if key in KUBELET_SYSCTLS:
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value + "\n")


def require_host_tools() -> None:
    """containerd, runc, the CNI plugins, ...: installed now if missing (hostpkgs.py)."""
    import hostpkgs

    hostpkgs.ensure(hostpkgs.REAL_NODES)


# ----------------------------------------------------------------------------------------------
# network


def make_network(fabric: str, nodes: Sequence[RealNode]) -> None:
    sh(["ip", "netns", "add", fabric], "creating the fabric namespace")
    ipf = ["ip", "-n", fabric]
    sh([*ipf, "link", "set", "lo", "up"], "fabric lo")
    sh([*ipf, "link", "add", "br0", "type", "bridge"], "fabric bridge")
    sh([*ipf, "addr", "add", f"{FABRIC_GATEWAY}/24", "dev", "br0"], "fabric address")
    sh([*ipf, "link", "set", "br0", "up"], "fabric bridge up")
    for ip in (API_SERVICE_IP, DNS_SERVICE_IP):
        sh([*ipf, "addr", "add", f"{ip}/32", "dev", "lo"], f"service address {ip}")
    sysctl_forward(fabric)
    for n in nodes:
        sh(["ip", "netns", "add", n.netns], f"creating the namespace of {n.name}")
        ipn = ["ip", "-n", n.netns]
        peer = f"n{n.index}"
        sh(
            [*ipf, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", n.netns],
            f"veth of {n.name}",
        )
        sh([*ipf, "link", "set", peer, "master", "br0", "up"], f"veth of {n.name} on br0")
        sh([*ipn, "link", "set", "lo", "up"], f"lo of {n.name}")
        sh([*ipn, "addr", "add", f"{n.ip}/24", "dev", "eth0"], f"address of {n.name}")
        sh([*ipn, "link", "set", "eth0", "up"], f"eth0 of {n.name}")
        sh([*ipn, "route", "add", "default", "via", FABRIC_GATEWAY], f"default route of {n.name}")
        sh([*ipf, "route", "add", n.pod_cidr, "via", n.ip], f"fabric route to {n.name}'s pods")
        sysctl_forward(n.netns)
    for n in nodes:  # direct routes between nodes, so pod traffic does not hairpin the fabric
        for other in nodes:
            if other is not n:
                sh(
                    ["ip", "-n", n.netns, "route", "add", other.pod_cidr, "via", other.ip],
                    f"route {n.name} -> {other.name}",
                )


def sysctl_forward(netns: str) -> None:
    sh(
        in_netns(netns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]),
        f"ip_forward in {netns}",
    )


def delete_netns(names: Sequence[str]) -> list[str]:
    existing = set(sh(["ip", "netns", "list"], "ip netns list", check=False).split())
    gone = []
    for name in names:
        if name in existing:
            sh(["ip", "netns", "delete", name], f"deleting namespace {name}", check=False)
            gone.append(name)
    return gone


# ----------------------------------------------------------------------------------------------
# per-node configuration


def containerd_config(n: RealNode, sandbox_image: str) -> Path:
    d = n.root / "containerd"
    (n.root / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    text = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
oom_score = 0

[grpc]
  address = "{n.socket}"

[ttrpc]
  address = "{d / "containerd.ttrpc.sock"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # Pod network namespaces under this node's state, not the shared /var/run/netns.
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{n.root / "cni" / "net.d"}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state per node, not the shared /run/containerd/runc.
        Root = "{d / "runc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
"""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "config.toml"
    path.write_text(text)
    return path


def cni_config(n: RealNode, network: str) -> None:
    gateway = n.pod_cidr.replace(".0/24", ".1")
    conf = {
        "cniVersion": "0.4.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,  # no NAT anywhere: pod addresses are routed as they are
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": n.pod_cidr, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(n.root / "cni" / "ipam"),
                },
            },
        ],
    }
    path = n.root / "cni" / "net.d" / "10-pods.conflist"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(conf, indent=2) + "\n")


def kubelet_config(n: RealNode, pki: Path) -> Path:
    d = n.root / "kubelet"
    d.mkdir(parents=True, exist_ok=True)
    text = f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 and no systemd here; every node's pods under its own cgroup root, so two kubelets
# on one host do not manage each other's cgroups.
cgroupDriver: cgroupfs
cgroupRoot: {n.cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://{n.socket}
address: {n.ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {pki / "ca.crt"}
authorization:
  mode: AlwaysAllow
clusterDomain: cluster.local
clusterDNS: [{DNS_SERVICE_IP}]
# Only cluster DNS in pods: the host's resolv.conf names servers pods must not use.
resolvConf: ""
podLogsDir: {d / "pod-logs"}
registerNode: true
nodeStatusUpdateFrequency: 4s
nodeStatusReportFrequency: 10s
serializeImagePulls: false
# The imported images are the only copies (no registry): never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
maxPods: 30
"""
    path = d / "config.yaml"
    path.write_text(text)
    return path


def write_kubeconfig(path: Path, pki: Path, server: str) -> None:
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": b64(pki / "admin.crt"),
                    "client-key-data": b64(pki / "admin.key"),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)


def corefile(state: Path) -> Path:
    d = state / "dns"
    d.mkdir(parents=True, exist_ok=True)
    text = f"""cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {d / "kubeconfig"} local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""
    path = d / "Corefile"
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------------------------
# start


Spawn = Callable[..., Any]  # the driver's spawn(state, name, argv) -> Proc


def spawn_containerd(state: Path, n: RealNode, spawn: Spawn) -> Any:
    cfg = n.root / "containerd" / "config.toml"
    return spawn(
        state, f"containerd-{n.name}", in_netns(n.netns, ["containerd", "--config", str(cfg)])
    )


def spawn_kubelet(state: Path, n: RealNode, kubelet: str, spawn: Spawn) -> Any:
    """The node's kubelet, from the configuration files start() wrote under the node's dir."""
    make_cgroups(n.cgroup_root)
    d = n.root / "kubelet"
    return spawn(
        state,
        f"kubelet-{n.name}",
        in_netns(
            n.netns,
            [
                kubelet,
                f"--config={d / 'config.yaml'}",
                f"--kubeconfig={d / 'kubeconfig'}",
                f"--root-dir={d / 'root'}",
                f"--hostname-override={n.name}",
                f"--node-ip={n.ip}",
                f"--node-labels={REAL_NODE_LABEL}=real",
                "--v=1",
            ],
        ),
    )


def restart_node(state: Path, n: RealNode, kubelet: str, spawn: Spawn, timeout: float) -> list[str]:
    """A node back after kill-node (a machine rebooted): its containerd again, with the images
    it already had, then its kubelet, which re-registers the node. Returns what was started."""
    started = []
    if read_pid(state, f"containerd-{n.name}") is None:
        p = spawn_containerd(state, n, spawn)
        wait_socket(n, timeout, p.alive)
        started.append(f"containerd-{n.name}")
    if read_pid(state, f"kubelet-{n.name}") is None:
        spawn_kubelet(state, n, kubelet, spawn)
        started.append(f"kubelet-{n.name}")
    return started


def ctr(n: RealNode, *args: str) -> list[str]:
    return ["ctr", "--address", str(n.socket), "-n", CONTAINERD_NS, *args]


def wait_socket(n: RealNode, timeout: float, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if n.socket.exists():
            proc = subprocess.run(ctr(n, "version"), capture_output=True, check=False)
            if proc.returncode == 0:
                return
        if not alive():
            die(f"containerd of {n.name} exited; see its log in the state directory")
        time.sleep(0.2)
    die(f"containerd of {n.name} did not answer on {n.socket} within {timeout:.0f} s")


def start(
    state: Path,
    count: int,
    k8s: str,
    kubelet: str,
    coredns: str,
    apiserver_port: int,
    images: dict[str, Any],
    spawn: Spawn,
    timeout: float,
) -> dict[str, Any]:
    """Create the namespaces and start the forwarder, CoreDNS and each node's containerd and
    kubelet. Returns what goes into cluster.json under "real_nodes"."""
    require_host_tools()
    fabric, nodes = plan(state, count)
    pki = state / "pki"
    # Recorded first, so that a failure from here on is cleaned up by teardown().
    layout: dict[str, Any] = {
        "fabric_netns": fabric,
        "nodes": [n.info() for n in nodes],
        "api_service_ip": API_SERVICE_IP,
        "dns_service_ip": DNS_SERVICE_IP,
        "label": {REAL_NODE_LABEL: "real"},
        "host_sysctls": read_sysctls(),
    }
    (state / "real-nodes.json").write_text(json.dumps(layout, indent=2) + "\n")
    delete_netns([fabric, *(n.netns for n in nodes)])  # left over from a crashed run
    make_network(fabric, nodes)

    spawn(
        state,
        "api-forwarder",
        [
            k8s,
            "netns-forward",
            f"--target=127.0.0.1:{apiserver_port}",
            f"--connect-proxy={egress_socket(state)}",
            f"--connect-netns={NETNS_DIR / fabric}",
            f"{NETNS_DIR / fabric}={API_SERVICE_IP}:443",
        ],
    )
    in_cluster = f"https://{API_SERVICE_IP}:443"
    write_kubeconfig(state / "dns" / "kubeconfig", pki, in_cluster)
    spawn(state, "coredns", in_netns(fabric, [coredns, "-conf", str(corefile(state))]))

    sandbox = images["pause"]["ref"]
    t = time.monotonic()
    seed = nodeseed.seeded_root(
        {
            images[k]["ref"]: Path(images[k]["archive"])
            # base: the image without this project (own code in a plain Python image)
            for k in ("pause", "operator", "trainer", "base")
        }
    )
    ctd_procs = []
    for n in nodes:
        cni_config(n, f"{cluster_id(state)}-{n.name}")
        nodeseed.clone_root(seed, containerd_config(n, sandbox).parent / "root")
        ctd_procs.append(spawn_containerd(state, n, spawn))
    seconds = time.monotonic() - t
    log(f"images in {len(nodes)} nodes (one seed, hard-linked) in {seconds:.0f} s")
    for n, p in zip(nodes, ctd_procs, strict=True):
        wait_socket(n, timeout, p.alive)

    for n in nodes:
        write_kubeconfig(n.root / "kubelet" / "kubeconfig", pki, in_cluster)
        kubelet_config(n, pki)
        spawn_kubelet(state, n, kubelet, spawn)
    layout["import_seconds"] = round(seconds, 1)
    (state / "real-nodes.json").write_text(json.dumps(layout, indent=2) + "\n")
    return layout


# ----------------------------------------------------------------------------------------------
# stop


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def signal_and_wait(pids: Sequence[int], sig: int, timeout: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def shim_pids(n: RealNode) -> list[int]:
    """containerd-shim-runc-v2 processes of this node's containerd (they outlive it; matched by
    the exact socket path of this node on their command line)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(n.socket).encode() in argv:
            out.append(int(proc.name))
    return out


def kill_containers(n: RealNode) -> int:
    """SIGKILL every container of the node (pods and sandboxes) through its runtime, then delete
    the tasks, so that their shims unmount the root filesystems and exit; returns how many."""
    if not n.socket.exists():
        return 0
    proc = subprocess.run(
        ctr(n, "tasks", "list", "-q"), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return 0
    ids = proc.stdout.split()
    for cid in ids:
        subprocess.run(
            ctr(n, "tasks", "kill", "--signal", "SIGKILL", cid), capture_output=True, check=False
        )
    for cid in ids:
        subprocess.run(ctr(n, "tasks", "delete", "--force", cid), capture_output=True, check=False)
    return len(ids)


def unmount_under(root: Path) -> int:
    """Unmount everything mounted below root (deepest first): pod volumes, netns, rootfs."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return len(set(points))


def make_cgroups(cgroup_root: str) -> None:
    """The kubelet refuses a cgroupRoot that does not exist in every hierarchy. cgroup v1: one
    directory per controller; cpuset needs its CPUs and memory nodes before tasks can join."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        if not controller.is_dir() or controller.name == "unified":
            continue
        top = controller / cgroup_root.lstrip("/")
        top.mkdir(exist_ok=True)
        if controller.name == "cpuset":
            for key in ("cpuset.cpus", "cpuset.mems"):
                (top / key).write_text((controller / key).read_text())


def remove_cgroups(cgroup_root: str) -> None:
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / cgroup_root.lstrip("/")
        if not top.is_dir():
            continue
        for d in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def read_pid(state: Path, name: str) -> int | None:
    f = state / "pids" / f"{name}.pid"
    if not f.is_file():
        return None
    parts = f.read_text().split()
    if len(parts) != 2 or not parts[0].isdigit():
        return None
    pid = int(parts[0])
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if stat[stat.rfind(")") + 2 :].split()[19] != parts[1]:
        return None  # the PID was reused by another process
    return pid


def stop_node(state: Path, n: RealNode) -> list[str]:
    """Stop a node the hard way (a node lost): kubelet, every container, containerd, shims."""
    stopped = []
    kubelet = read_pid(state, f"kubelet-{n.name}")
    if kubelet is not None:
        signal_and_wait([kubelet], signal.SIGKILL, 5)
        stopped.append(f"kubelet-{n.name}")
    (state / "pids" / f"kubelet-{n.name}.pid").unlink(missing_ok=True)
    killed = kill_containers(n)
    if killed:
        stopped.append(f"{killed} containers")
    ctd = read_pid(state, f"containerd-{n.name}")
    if ctd is not None:
        signal_and_wait([ctd], signal.SIGTERM, 10)
        signal_and_wait([ctd], signal.SIGKILL, 5)
        stopped.append(f"containerd-{n.name}")
    (state / "pids" / f"containerd-{n.name}.pid").unlink(missing_ok=True)
    shims = shim_pids(n)
    if shims:
        signal_and_wait(shims, signal.SIGKILL, 5)
        stopped.append(f"{len(shims)} shims")
    return stopped


def load_layout(state: Path) -> tuple[str, list[RealNode]] | None:
    f = state / "real-nodes.json"
    if not f.is_file():
        return None
    data = json.loads(f.read_text())
    nodes = [
        RealNode(i, d["name"], d["netns"], Path(d["dir"])) for i, d in enumerate(data["nodes"])
    ]
    return data["fabric_netns"], nodes


def teardown(state: Path) -> list[str]:
    """Stop every real-node process and remove every namespace, mount and cgroup made by start()."""
    layout = load_layout(state)
    if layout is None:
        return []
    fabric, nodes = layout
    stopped = []
    for n in nodes:
        stopped += stop_node(state, n)
    for name in ("coredns", "api-forwarder"):
        pid = read_pid(state, name)
        if pid is not None:
            signal_and_wait([pid], signal.SIGTERM, 5)
            signal_and_wait([pid], signal.SIGKILL, 5)
            stopped.append(name)
        (state / "pids" / f"{name}.pid").unlink(missing_ok=True)
    mounts = sum(unmount_under(n.root) for n in nodes)
    if mounts:
        stopped.append(f"{mounts} mounts")
    for n in nodes:
        remove_cgroups(n.cgroup_root)
        for link in Path("/var/log/containers").glob("*.log"):
            with contextlib.suppress(OSError):
                if str(n.root) in os.readlink(link):
                    link.unlink()
        network = f"{cluster_id(state)}-{n.name}"
        for cached in Path("/var/lib/cni/results").glob(f"{network}-*"):
            cached.unlink(missing_ok=True)  # CNI's result cache of sandboxes killed, not removed
    stopped += [f"netns {name}" for name in delete_netns([fabric, *(n.netns for n in nodes)])]
    restore_sysctls(json.loads((state / "real-nodes.json").read_text()).get("host_sysctls", {}))
    (state / "real-nodes.json").unlink()
    return stopped


def node_by_name(state: Path, name: str) -> RealNode:
    layout = load_layout(state)
    if layout is None:
        die(f"the cluster in {state} has no real nodes (start it with `up --real-nodes N`)")
    for n in layout[1]:
        if n.name == name:
            return n
    die(
        f"{name} is not a real node of {state} (real nodes: {', '.join(n.name for n in layout[1])})"
    )


CONTAINER_ID_RE = re.compile(r"^containerd://([0-9a-f]{64})$")
