"""Kill the operator while it creates a 64-pod gang; a new one converges (issue 6 acceptance 8)."""

from __future__ import annotations

import signal
import time

from .conftest import Cluster
from .operator_support import Op, install_crd, pods, status, tiny_gpu_job, wait_pods


def test_killed_mid_creation_converges_to_one_attempt(
    cluster: Cluster, namespace: str, tmp_path_factory: object
) -> None:
    install_crd(cluster)
    log_dir = tmp_path_factory.mktemp("crash")  # type: ignore[attr-defined]
    # One API worker makes creation sequential, so there is a wide window to kill it in.
    op = Op(cluster, log_dir, "--workers=1")
    op.start()
    try:
        cluster.apply(tiny_gpu_job("wide", nodes=64), namespace)
        deadline = time.monotonic() + 60
        seen = 0
        while time.monotonic() < deadline:
            seen = len(pods(cluster, namespace, "wide"))
            if seen >= 5:
                break
            time.sleep(0.05)
        op.kill(signal.SIGKILL)
        killed_at = len(pods(cluster, namespace, "wide"))
        assert 0 < killed_at < 64, f"not killed mid-creation: {killed_at} pods existed"
        time.sleep(1)
        assert len(pods(cluster, namespace, "wide")) == killed_at  # nobody else is creating

        op.start("--workers=32")
        created = wait_pods(cluster, namespace, "wide", 64, timeout=120)
        attempts = {p["metadata"]["labels"]["megatron.dev/restart-attempt"] for p in created}
        names = sorted(p["metadata"]["name"] for p in created)
        assert attempts == {"0"}
        assert names == sorted(f"wide-a0-{i}" for i in range(64))
        cluster.wait(
            lambda: status(cluster, namespace, "wide").get("launchedAttempt") == 0,
            30,
            what="the attempt recorded as launched",
        )
        st = status(cluster, namespace, "wide")
        assert (st["restarts"], st["restartAttempt"]) == (0, 0)
        time.sleep(2)
        assert len(pods(cluster, namespace, "wide")) == 64  # still exactly 64
        assert "Traceback" not in op.logs()
    finally:
        op.stop()
        cluster.kubectl("delete", "mj", "-n", namespace, "wide", "--wait=false", check=False)
