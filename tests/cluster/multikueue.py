"""MultiKueue for the local cluster: a manager control plane and N worker control planes.

`cluster up --state DIR --multikueue-workers N` calls `up()`; `down` calls `teardown()`.

    DIR/                      the manager: etcd, apiserver, controller-manager, scheduler, Kueue
                              (with MultiKueue), no nodes
    DIR/workers/worker-<i>/   worker i: its own etcd, apiserver, controller-manager, scheduler,
                              kwok with the --nodes GPU nodes, Kueue

Each is an ordinary `cluster up` state directory (its own cluster.json, pids, logs, PKI), so
every other command (`fail-pod`, `status`, ...) works on a worker with `--state
DIR/workers/worker-<i>`. On the manager, `up` creates what MultiKueue needs, in `kueue-system`:

- Secret `worker-<i>-kubeconfig` (key `kubeconfig`: the worker's admin kubeconfig, certificate
  data inline, as Kueue requires) and MultiKueueCluster `worker-<i>` naming it;
- MultiKueueConfig `megatron` listing the workers, and AdmissionCheck `megatron-multikueue`
  (controller `kueue.x-k8s.io/multikueue`) pointing at it;
- the Kueue configuration's `multiKueue.externalFrameworks` entry for MegatronJob, with the
  feature gate `MultiKueueAdaptersForCustomJobs` (beta and on by default since Kueue 0.15; set
  explicitly).

Before the MultiKueueClusters, the repository's CRDs (`crds/`: MegatronJob) are applied to the
manager and every worker: MultiKueue watches the external kind on each worker and keeps a
cluster inactive until it is served there. Queues are left to the user: ClusterQueues on the
manager name the admission check, and each worker has queues of the same names. Python standard
library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import CliError, die, log

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
NAMESPACE = "kueue-system"
CONFIG_NAME = "megatron"
ADMISSION_CHECK = "megatron-multikueue"
CONTROLLER = "kueue.x-k8s.io/multikueue"
FEATURE_GATE = "MultiKueueAdaptersForCustomJobs"
# The external framework's CRD (MegatronJob), installed on the manager and every worker.
CRDS = Path(__file__).resolve().parents[2] / "crds"


def worker_name(i: int) -> str:
    return f"worker-{i}"


def worker_states(state: Path) -> list[Path]:
    """The workers' state directories under a manager's, in order."""
    root = state / "workers"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("worker-")]
    return sorted(found, key=lambda p: int(p.name.removeprefix("worker-") or 0))


def manager_kueue(opts: Any) -> Any:
    """The manager's options: no nodes, Kueue with MultiKueue for the external frameworks."""
    frameworks = list(opts.external_frameworks)
    return replace(
        opts,
        nodes=0,
        real_nodes=0,
        pvs=0,
        kueue=True,
        jobset=False,
        announce=False,
        kueue_feature_gates={FEATURE_GATE: True},
        kueue_multikueue_frameworks=frameworks,
    )


def objects(workers: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """(API path, object) for each object MultiKueue needs on the manager, in creation order.
    `workers`: (name, kubeconfig text)."""
    import base64

    out: list[tuple[str, dict[str, Any]]] = []
    for name, kubeconfig in workers:
        out.append(
            (
                f"/api/v1/namespaces/{NAMESPACE}/secrets",
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": f"{name}-kubeconfig", "namespace": NAMESPACE},
                    "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
                },
            )
        )
        out.append(
            (
                f"{KUEUE_API}/multikueueclusters",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "MultiKueueCluster",
                    "metadata": {"name": name},
                    "spec": {
                        "clusterSource": {
                            "kubeConfig": {
                                "locationType": "Secret",
                                "location": f"{name}-kubeconfig",
                            }
                        }
                    },
                },
            )
        )
    out.append(
        (
            f"{KUEUE_API}/multikueueconfigs",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "MultiKueueConfig",
                "metadata": {"name": CONFIG_NAME},
                "spec": {"clusters": [name for name, _ in workers]},
            },
        )
    )
    out.append(
        (
            f"{KUEUE_API}/admissionchecks",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "AdmissionCheck",
                "metadata": {"name": ADMISSION_CHECK},
                "spec": {
                    "controllerName": CONTROLLER,
                    "parameters": {
                        "apiGroup": "kueue.x-k8s.io",
                        "kind": "MultiKueueConfig",
                        "name": CONFIG_NAME,
                    },
                },
            },
        )
    )
    return out


def apply_crds(
    state: Path,
    wait_for: Callable[..., None],
    conditions: Callable[[dict[str, Any]], dict[str, str]],
    api_from_state: Callable[[Path], Any],
    timeout: float,
) -> None:
    """The repository's CRDs (crds/*.yaml: MegatronJob), applied server-side, established."""
    info = json.loads((state / "cluster.json").read_text())
    proc = subprocess.run(
        [
            info["kubectl"],
            f"--kubeconfig={info['kubeconfig']}",
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            str(CRDS),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        die(f"applying {CRDS} to {state} failed:\n{proc.stderr.strip()}")
    api = api_from_state(state)
    names = [
        m.group(1)
        for f in sorted(CRDS.glob("*.yaml"))
        if (m := re.search(r"^  name: (\S+)$", f.read_text(), re.M))
    ]

    def established() -> bool:
        return all(
            conditions(api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")).get(
                "Established"
            )
            == "True"
            for n in names
        )

    wait_for(f"the CRDs of {CRDS} in {state}", established, timeout)


def in_parallel(tasks: list[Callable[[], None]]) -> list[bool]:
    """Run each task in a forked child; return which failed. A child's error is printed by the
    child, as `cluster` prints its own."""
    pids = []
    for task in tasks:
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                task()
            except CliError as e:
                print(f"cluster up: error: {e}", file=sys.stderr, flush=True)
                code = 1
            except BaseException as e:  # never return into the parent's code
                print(f"cluster up: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                code = 1
            finally:
                sys.stdout.flush()
                os._exit(code)
        pids.append(pid)
    return [os.waitpid(pid, 0)[1] != 0 for pid in pids]


def up(
    opts: Any,
    workers: int,
    cmd_up: Callable[[Any], None],
    api_from_state: Callable[[Path], Any],
    wait_for: Callable[..., None],
    conditions: Callable[[dict[str, Any]], dict[str, str]],
    stop_everything: Callable[[Path], list[str]],
) -> None:
    """Start N workers, then the manager; configure MultiKueue on the manager. Prints
    WORKER_KUBECONFIG_<i>= for each worker, then KUBECONFIG= (the manager's) last."""
    if not 1 <= workers <= 8:
        die("--multikueue-workers must be within 1..8")
    if opts.real_nodes:
        die("--multikueue-workers does not combine with --real-nodes")
    state: Path = opts.state
    started: list[Path] = []
    try:
        worker_info = []
        wstates = [state / "workers" / worker_name(i) for i in range(1, workers + 1)]
        log(
            f"starting {workers} workers ({opts.nodes} nodes and Kueue each) under "
            f"{state}/workers, and the manager (no nodes, Kueue with MultiKueue) in {state}"
        )
        # In parallel, one process each: a control plane's start is mostly waiting. A failed
        # `up` stops what it started itself (and never a cluster already running).
        tasks: list[Callable[[], None]] = [
            lambda w=w: cmd_up(replace(opts, state=w, kueue=True, jobset=False, announce=False))
            for w in wstates
        ]
        failed = in_parallel([*tasks, lambda: cmd_up(manager_kueue(opts))])
        everyone = [*wstates, state]
        # The workers first: stopping the manager's state stops its workers too.
        started += [w for w, bad in zip(everyone, failed, strict=True) if not bad]
        if any(failed):
            names = ", ".join(w.name for w, bad in zip(everyone, failed, strict=True) if bad)
            die(f"{names} did not start (see the messages above)")
        for i, wstate in enumerate(wstates, start=1):
            info = json.loads((wstate / "cluster.json").read_text())
            worker_info.append((worker_name(i), wstate, info))
        # MultiKueue watches the external kinds on every worker: a MultiKueueCluster stays
        # inactive ("no matches for kind MegatronJob") until the worker serves the CRD.
        for s in started:
            apply_crds(s, wait_for, conditions, api_from_state, opts.timeout)
        api = api_from_state(state)
        kubeconfigs = [
            (name, Path(info["kubeconfig"]).read_text()) for name, _, info in worker_info
        ]
        for path, obj in objects(kubeconfigs):
            api.create(path, obj)

        def active(path: str) -> bool:
            return conditions(api.get(path)).get("Active") == "True"

        for name, _, _ in worker_info:
            wait_for(
                f"MultiKueueCluster {name} to be Active (Kueue reaches the worker)",
                lambda n=name: active(f"{KUEUE_API}/multikueueclusters/{n}"),
                opts.timeout,
            )
        wait_for(
            f"AdmissionCheck {ADMISSION_CHECK} to be Active",
            lambda: active(f"{KUEUE_API}/admissionchecks/{ADMISSION_CHECK}"),
            opts.timeout,
        )
    except BaseException:
        for s in reversed(started):
            stop_everything(s)
        raise
    summary = {
        "workers": [
            {"name": name, "state": str(wstate), "kubeconfig": info["kubeconfig"]}
            for name, wstate, info in worker_info
        ],
        "multikueue_config": CONFIG_NAME,
        "admission_check": ADMISSION_CHECK,
        "feature_gates": {FEATURE_GATE: True},
        "external_frameworks": list(opts.external_frameworks),
    }
    manager = json.loads((state / "cluster.json").read_text())
    manager["multikueue"] = summary
    (state / "cluster.json").write_text(json.dumps(manager, indent=2) + "\n")
    for i, (_, _, info) in enumerate(worker_info, start=1):
        print(f"WORKER_KUBECONFIG_{i}={info['kubeconfig']}")
    print(f"KUBECONFIG={manager['kubeconfig']}")


def teardown(state: Path, stop_everything: Callable[[Path], list[str]]) -> list[str]:
    """Stop every worker under a manager's state directory, in parallel (an apiserver takes
    seconds to shut down); their names prefixed."""
    wstates = worker_states(state)
    results: dict[Path, list[str]] = {}
    errors: list[BaseException] = []

    def stop(w: Path) -> None:
        try:
            results[w] = stop_everything(w)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=stop, args=(w,)) for w in wstates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [f"{w.name}/{name}" for w in wstates for name in results.get(w, [])]
