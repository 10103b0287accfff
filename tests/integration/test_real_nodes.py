"""Real nodes: kubelets and containerd in network namespaces, our images in real pods.

The session's real cluster (`real_cluster`, conftest.py: 1 kwok node, 3 real nodes). What a
lost node leaves running is checked by test_e2e.py's node-loss scenario (which kills one and
restarts it), and that `down` leaves no process, namespace, mount or link by the fixture's
teardown at the end of the session (real_nodes_support.assert_nothing_left).
"""

from __future__ import annotations

import os
import tomllib
import uuid
from pathlib import Path

from .real_nodes_support import REAL_LABEL, RealCluster, netns_list, pod, python_pod

# The package version the images were built from (pyproject.toml).
VERSION = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
    "project"
]["version"]
VERSION_CODE = (
    "import importlib.metadata as m, os, torch, megatron.core, megatron_trainer;"
    "print('megatron-operator', m.version('megatron-operator'), 'torch', torch.__version__,"
    " 'uid', os.getuid(), 'dot', float(torch.ones(4) @ torch.ones(4)));"
    "from megatron_contract.env import usable_cores; from megatron_contract.cpus import cpu_limit;"
    "print('cores', usable_cores(), 'limit', cpu_limit(), 'affinity', len(os.sched_getaffinity(0)))"
)


def new_ns(c: RealCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", name)
    c.wait(
        lambda: c.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
        what=f"the default ServiceAccount of {name}",
    )
    return name


def test_real_nodes_register_ready_with_label(real_cluster: RealCluster) -> None:
    c = real_cluster
    assert c.real_nodes == ["real-node-0", "real-node-1", "real-node-2"]
    nodes = {n["metadata"]["name"]: n for n in c.kubectl_json("get", "nodes")["items"]}
    for name in c.real_nodes:
        node = nodes[name]
        assert node["metadata"]["labels"][REAL_LABEL] == "real"
        ready = {x["type"]: x["status"] for x in node["status"]["conditions"]}["Ready"]
        assert ready == "True"
        # A real kubelet reports the host's CPUs, not kwok's fake 96.
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert "gpu-node-000" in nodes  # the kwok node is still there, still managed by kwok
    ours = {c.real["fabric_netns"], *(n["netns"] for n in c.real["nodes"])}
    assert ours <= netns_list()
    for name in ("operator", "trainer", "pause"):
        assert c.image(name).startswith("localhost/megatron-operator/")


def test_trainer_image_runs_on_each_real_node(real_cluster: RealCluster) -> None:
    c = real_cluster
    ns = new_ns(c, "version")
    for node in c.real_nodes:
        doc = python_pod(f"v-{node}", c.image("trainer"), node, VERSION_CODE)
        # A CPU limit below the node's cores: the launcher shares out the limit (its cgroup's
        # quota, as runc sets it), not the affinity, which still lists every core.
        doc["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "2Gi"}}
        c.apply(doc, ns)
    for node in c.real_nodes:
        done = c.wait_pod_done(ns, f"v-{node}", timeout=180)
        logs = c.logs(ns, f"v-{node}")
        assert done["status"]["phase"] == "Succeeded", logs
        assert done["spec"]["nodeName"] == node
        assert f"megatron-operator {VERSION} torch 2." in logs
        assert "uid 1000 dot 4.0" in logs
        assert f"cores 1 limit 1.0 affinity {len(os.sched_getaffinity(0))}" in logs, logs
    c.kubectl("delete", "namespace", ns, "--wait=false")


SERVER_CODE = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 29500)); s.listen(1)
print("listening", flush=True)
conn, peer = s.accept()
data = conn.recv(100)
conn.sendall(b"pong:" + data)
print("served", peer[0], flush=True)
"""

CLIENT_CODE = """
import socket, time, sys
name = sys.argv[1]
deadline = time.time() + 90
while True:
    try:
        addr = socket.gethostbyname(name)
        conn = socket.create_connection((addr, 29500), timeout=5)
        break
    except OSError as e:
        if time.time() > deadline:
            raise
        time.sleep(1)
conn.sendall(b"ping")
print("resolved", addr, "reply", conn.recv(100).decode(), flush=True)
"""


def test_pod_to_pod_tcp_across_nodes_through_headless_service_dns(
    real_cluster: RealCluster,
) -> None:
    c = real_cluster
    ns = new_ns(c, "peers")
    c.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "peer"},
                "ports": [{"name": "rdzv", "port": 29500}],
            },
        },
        ns,
    )
    server = python_pod(
        "server",
        c.image("trainer"),
        "real-node-0",
        SERVER_CODE,
        labels={"app": "peer"},
        hostname="rank-0",
        subdomain="peers",
    )
    c.apply(server, ns)
    name = f"rank-0.peers.{ns}.svc.cluster.local"
    client = pod(
        "client",
        c.image("trainer"),
        "real-node-1",
        ["python", "-c", CLIENT_CODE, name],
    )
    c.apply(client, ns)
    done = c.wait_pod_done(ns, "client", timeout=150)
    logs = c.logs(ns, "client")
    assert done["status"]["phase"] == "Succeeded", logs
    server_ip = c.pod(ns, "server")["status"]["podIP"]
    client_ip = done["status"]["podIP"]
    # Each pod has an address of its own node's pod CIDR: the traffic crossed the fabric.
    assert server_ip.startswith("10.244.0."), server_ip
    assert client_ip.startswith("10.244.1."), client_ip
    assert f"resolved {server_ip} reply pong:ping" in logs
    c.wait_pod_done(ns, "server", timeout=30)
    assert f"served {client_ip}" in c.logs(ns, "server")
    c.kubectl("delete", "namespace", ns, "--wait=false")


API_CODE = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(f"{sa}/token").read()
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
for host in (os.environ["KUBERNETES_SERVICE_HOST"], "kubernetes.default.svc"):
    req = urllib.request.Request(
        f"https://{host}:443/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        user = json.load(resp)["status"]["userInfo"]["username"]
    print(host, "->", user, flush=True)
"""


def test_pod_reaches_the_apiserver_with_its_service_account_token(
    real_cluster: RealCluster,
) -> None:
    c = real_cluster
    ns = new_ns(c, "api")
    c.apply(python_pod("whoami", c.image("trainer"), "real-node-1", API_CODE), ns)
    done = c.wait_pod_done(ns, "whoami", timeout=120)
    logs = c.logs(ns, "whoami")
    assert done["status"]["phase"] == "Succeeded", logs
    user = f"system:serviceaccount:{ns}:default"
    assert f"10.96.0.1 -> {user}" in logs  # the Service IP the kubelet put in the environment
    assert f"kubernetes.default.svc -> {user}" in logs  # the same through cluster DNS
    c.kubectl("delete", "namespace", ns, "--wait=false")


# The container's main process is PID 1 of its PID namespace, and the kernel does not deliver
# a signal to PID 1 whose action is the default: like the trainer, it handles SIGTERM itself.
SLEEP_CODE = (
    "import signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    print('got SIGTERM', flush=True)\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('started', flush=True)\n"
    "time.sleep(3600)\n"
)


def test_kill_container_fails_the_pod_with_the_signal_exit_code(
    real_cluster: RealCluster,
) -> None:
    c = real_cluster
    ns = new_ns(c, "kill")
    cases = {"KILL": ("real-node-0", 137), "TERM": ("real-node-1", 143)}
    for sig, (node, _code) in cases.items():
        c.apply(python_pod(f"sleep-{sig.lower()}", c.image("trainer"), node, SLEEP_CODE), ns)
    for sig, (node, code) in cases.items():
        name = f"sleep-{sig.lower()}"
        c.wait_pod_phase(ns, name, "Running", timeout=120)
        out = c.kill_container(ns, name, sig)
        assert out["node"] == node and out["signal"] == f"SIG{sig}"
        done = c.wait_pod_done(ns, name, timeout=60)
        assert done["status"]["phase"] == "Failed"
        term = done["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == code, term
        assert term["containerID"].endswith(out["container_id"])
        assert ("got SIGTERM" in c.logs(ns, name)) == (sig == "TERM")
    c.kubectl("delete", "namespace", ns, "--wait=false")
