"""Your own code, and the evidence of failures, on real kubelets.

The session's real cluster and the chart's operator on real-node-0 (`real_operator`,
conftest.py), the trainer image built from Dockerfile.trainer (CPU torch); each test works in a
namespace of its own and deletes it:

- a plain torch.distributed script (examples/scripts/torch_ddp.py, in the trainer image at the
  path examples/byo-torch-ddp.yaml names) as spec.trainer.command on two pods, with
  restartPolicy.strategy Recreate: world size and ranks right, rank 1 failing on attempt 0 gives
  one gang restart, the job Succeeds, its progress lines reach the job's status through the
  Lease; the blamed pod of attempt 0 is still there after the restart, Failed, with its log
  (`kubectl logs`, `mjob logs`), and the failing rank's own line reaches the user (its kept log,
  or the AttemptFailed event);
- own code in an image without this project (the plain Debian base with Python 3.11, which the
  operator's init container gives the launcher): a stdlib stand-in for Megatron-LM that
  rendezvouses across the two pods and prints Megatron-LM's log lines; its rank killed from the
  host restarts in place (InPlace, the default: both pods keep their UIDs, restarts 1), and the
  job Succeeds with the progress its log lines gave;
- an image that does not exist: PodsStarted names ErrImagePull or ImagePullBackOff within 60 s,
  and at startupTimeoutSeconds the pods are deleted (what they requested is released) and the job
  fails by its rule.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .real_nodes_support import REAL_LABEL, SHARED_CHECKPOINT_VOLUME, RealCluster
from .test_e2e import job_status, wait_phase

pytestmark = pytest.mark.slow


@pytest.fixture
def ns(real_operator: RealCluster) -> Iterator[str]:
    """A namespace of the test's own, deleted at its end (the cluster is the session's)."""
    name = f"open-{uuid.uuid4().hex[:6]}"
    real_operator.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        real_operator.kubectl("delete", "namespace", name, "--wait=false", check=False)


def job_doc(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def base_spec(image: str) -> dict[str, Any]:
    return {
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {
            "nodes": 2,
            "procsPerNode": 1,
            "accelerator": "none",
            "requests": {"cpu": "500m", "memory": "1Gi"},
            "shmSize": "256Mi",
            "nodeSelector": {REAL_LABEL: "real"},
        },
        "checkpoint": {
            "volume": copy.deepcopy(SHARED_CHECKPOINT_VOLUME),
            "gracePeriodSeconds": 30,
        },
        "restartPolicy": {
            "maxRestarts": 3,
            "backoffSeconds": 1,
            "maxBackoffSeconds": 5,
            "hangTimeoutSeconds": 600,
        },
    }


def test_a_torch_distributed_script_restarts_once_and_succeeds(
    real_operator: RealCluster, ns: str
) -> None:
    c = real_operator
    spec = base_spec(c.image("trainer"))
    spec["restartPolicy"]["strategy"] = "Recreate"  # the gang rung, and its kept evidence
    spec["trainer"] = {
        "command": ["python", "examples/scripts/torch_ddp.py"],
        "args": [
            "--steps=12", "--save-interval=3", "--checkpoint-dir=$(MEGATRON_CHECKPOINT_DIR)",
            "--attempt=$(MEGATRON_RESTART_ATTEMPT)", "--fail-at-step=7", "--fail-rank=1",
        ],
    }  # fmt: skip
    c.apply(job_doc("ddp", spec), ns)
    st = wait_phase(c, ns, "ddp", {"Succeeded"}, 600)
    assert (st["restarts"], st["restartAttempt"]) == (1, 1), st
    # Progress from the script's `ITERATION LOSS` lines, forwarded to the Lease by node 0.
    assert st["progress"]["iteration"] == 12 and st["progress"]["checkpointIteration"] == 12
    assert st["progressSummary"].startswith("step 12 loss ")
    # Rank 1 exits 1 at step 7; rank 0, in the other pod, exits 1 on the broken collective
    # within milliseconds. The kubelet reports exit times to the second, so when the operator
    # sees both exits at once it cannot tell which came first (it blames the earlier second,
    # then the lower node rank). Either pod may be blamed; the cause's words must reach the
    # user either way.
    blamed = st["lastFailure"]["pod"]
    assert blamed in ("ddp-a0-0", "ddp-a0-1") and st["lastFailure"]["exitCode"] == 1, st
    # Evidence: attempt 0's blamed pod is still there, Failed, with its rank's lines.
    assert st["keptPods"] == [blamed], st
    kept = c.pod(ns, blamed)
    assert kept["status"]["phase"] == "Failed"
    failed_log = c.logs(ns, blamed)
    assert "local rank 0 exited with 1; stopping the others" in failed_log
    rank = int(blamed.rsplit("-", 1)[1])  # one rank per pod: the node rank is the rank
    mjob_logs = subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli.main", "logs", "ddp", "-n", ns,
         "--attempt", "0", "--rank", str(rank)],
        capture_output=True, text=True, env=c.env, timeout=120, check=False,
    )  # fmt: skip
    assert mjob_logs.returncode == 0 and "local rank 0 exited with 1" in mjob_logs.stdout
    # World size and ranks: rank 0 saw both ranks, one in each pod; the resume happened.
    rank0 = c.logs(ns, "ddp-a1-0")
    assert "torch_ddp: world size 2, ranks [(0, 0, 'ddp-0'), (1, 0, 'ddp-1')]" in rank0
    assert "torch_ddp: resumed from step 6 (attempt 1)" in rank0
    assert "torch_ddp: done, 12 steps" in rank0
    events = c.kubectl_json(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=ddp"
    )
    reports = [e["message"] for e in events["items"] if e["reason"] == "AttemptFailed"]
    assert len(reports) == 1 and f"pod {blamed}" in reports[0] and "exited 1" in reports[0]
    # The failing rank's own line: in the kept log, or in the report's tail of pod ddp-a0-1.
    cause = "torch_ddp: rank 1 fails at step 7 (attempt 0)"
    assert cause in failed_log or ("pod ddp-a0-1" in reports[0] and cause in reports[0]), reports[0]


# A stand-in for Megatron-LM in any image's python3 (stdlib only): the ranks meet at MASTER_ADDR:
# MASTER_PORT (a fresh port each attempt), resume from the tracker file rank 0 writes, and print
# Megatron-LM's training log line on the last rank and its save line on rank 0.
STAND_IN = """# megatron-stand-in
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
ckpt = os.environ["MEGATRON_CHECKPOINT_DIR"]
tracker = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
if rank == 0:
    srv = socket.create_server(("", port))
    peers = [srv.accept()[0] for _ in range(world - 1)]
else:
    for _ in range(600):
        try:
            peer = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("no rendezvous")
start = int(open(tracker).read()) if os.path.exists(tracker) else 0
print(f"stand-in rank {rank}/{world} resumes after {start} (python {sys.version.split()[0]})", flush=True)
for it in range(start + 1, 21):
    time.sleep(0.5)
    if rank == world - 1:
        print(f" [2026-11-02 10:00:00.000000] iteration {it:8d}/{20:8d} | consumed samples: {it * 8:12d} | elapsed time per iteration (ms): 500.0 | learning rate: 1.000000E-04 | global batch size:     8 | lm loss: {8.0 / it:.6E} | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 |", flush=True)
    if rank == 0 and it % 3 == 0:
        os.makedirs(ckpt, exist_ok=True)
        with open(tracker + ".tmp", "w") as f:
            f.write(str(it))
        os.replace(tracker + ".tmp", tracker)
        print(f"  [2026-11-02 10:00:00.000000] successfully saved checkpoint from iteration {it:7d} to {ckpt} [ t 1/1, p 1/1 ]", flush=True)
"""


def test_own_code_in_an_image_without_the_project_restarts_in_place(
    real_operator: RealCluster, ns: str
) -> None:
    c = real_operator
    spec = base_spec(c.image("base"))  # Debian's Python 3.11, no megatron_trainer in it
    # --save: where Megatron-LM's tracker is, which the last rank's launcher reads (rank 0,
    # whose save lines name the checkpoint, runs in the other pod).
    spec["trainer"] = {
        "command": ["python3", "-c", STAND_IN],
        "args": ["--save=$(MEGATRON_CHECKPOINT_DIR)"],
    }
    c.apply(job_doc("own", spec), ns)
    wait_phase(c, ns, "own", {"Running"}, 300)

    def uids() -> dict[str, str]:
        pods = c.kubectl_json("get", "pods", "-n", ns, "-l", "megatron.dev/job-name=own")
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods["items"]}

    first = uids()
    assert sorted(first) == ["own-a0-0", "own-a0-1"]
    pod = c.pod(ns, "own-a0-0")
    (init,) = pod["spec"]["initContainers"]  # the launcher, from the operator's image
    assert init["image"] == c.image("operator")
    assert pod["spec"]["containers"][0]["command"][0] == "python3"
    c.wait(lambda: "iteration        5/" in c.logs(ns, "own-a0-1"), 120, 0.5, "step 5")
    killed = c.kill_process(ns, "own-a0-1", "megatron-stand-in", RANK="1")
    assert killed["signal"] == "SIGKILL", killed
    st = wait_phase(c, ns, "own", {"Succeeded"}, 300)
    assert (st["restarts"], st["restartAttempt"]) == (1, 1), st
    assert st["lastFailure"]["rung"] == "InPlace", st["lastFailure"]
    assert uids() == first  # the same pods: no pod, IP or GPU given up
    # Progress from the log lines alone: the last step, its loss, and the newest checkpoint
    # (saved every 3 steps: 18), from the tracker under --save.
    progress = st["progress"]
    assert progress["iteration"] == 20 and progress["attempt"] == 1, progress
    assert abs(progress["loss"] - 8.0 / 20) < 1e-6, progress
    assert progress["checkpointIteration"] == 18, progress
    log1 = c.logs(ns, "own-a0-1")
    assert "started the ranks of attempt 1" in log1, log1[-3000:]
    # Attempt 1 resumed from the tracker: a save of attempt 0 (rank 0 saves every 3 steps, in
    # step with the last rank but not in lockstep), not step 0 and not the end. Where the kill
    # landed depends on the load: the log is polled.
    _, _, after = log1.partition("started the ranks of attempt 1")
    resumed = re.search(r"resumes after (\d+)", after)
    assert resumed, log1[-3000:]
    assert 3 <= int(resumed[1]) <= 18 and int(resumed[1]) % 3 == 0, log1[-3000:]
    assert "(python 3.11" in log1


def test_an_image_that_does_not_exist_is_named_and_released(
    real_operator: RealCluster, ns: str
) -> None:
    c = real_operator
    spec = base_spec("localhost/megatron-operator/does-not-exist:1")
    spec["model"] = {"recipe": "gpt-tiny"}
    spec["training"] = {"globalBatchSize": 8, "trainIters": 10, "precision": "fp32"}
    spec["data"] = {"mock": True}
    # 90 s: on a loaded CI machine the claim, the scheduling and the kubelet's first pull took
    # over 60 s, and a timeout firing first would hide the pull's reason.
    spec["restartPolicy"].update(
        startupTimeoutSeconds=90, rules=[{"action": "Fail", "reasons": ["StartupTimeout"]}]
    )
    applied = time.monotonic()
    c.apply(job_doc("noimg", spec), ns)

    seen: list[Any] = []

    def named() -> dict[str, Any] | None:
        cond = next(
            (
                x
                for x in job_status(c, ns, "noimg").get("conditions", [])
                if x["type"] == "PodsStarted"
            ),
            None,
        )
        seen[:] = [
            cond,
            [p.get("status") for p in c.kubectl_json("get", "pods", "-n", ns)["items"]],
        ]
        ok = (
            cond
            and cond["status"] == "False"
            and cond["reason"] in ("ErrImagePull", "ImagePullBackOff")
        )
        return cond if ok else None

    try:
        cond = c.wait(named, 90, 1.0, "PodsStarted naming the image pull")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None
    assert time.monotonic() - applied <= 90
    assert cond["message"].startswith("pod noimg-a0-"), cond
    assert "does-not-exist" in cond["message"], cond  # the kubelet's own words
    st = wait_phase(c, ns, "noimg", {"Failed"}, 150)
    failed_at = time.monotonic()
    assert st["lastFailure"]["reason"] == "StartupTimeout", st
    assert "startupTimeoutSeconds" in st["lastFailure"]["message"]

    # Released: no pod of the job holds anything once the job failed (none was Failed to keep).
    def gone() -> bool:
        items = c.kubectl_json("get", "pods", "-n", ns, "-l", "megatron.dev/job-name=noimg")
        return not items["items"]

    c.wait(gone, 60, 1.0, "the pods deleted")
    # The timeout counts from the first pod's scheduling, a few seconds after the apply; that
    # time is the PodScheduled condition's, in whole seconds (up to 1 s before the real one).
    assert 90 - 1 <= failed_at - applied <= 90 + 60
