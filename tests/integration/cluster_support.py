"""The local cluster as tests see it: `Cluster` (kubectl, helm, faults, waiting) and the driver
calls that build and start one. The fixtures that hand them to tests are in conftest.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .kubeget import Reader

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "cluster" / "cluster"


def run_driver(*args: str, timeout: float = 600) -> str:
    """Run tests/cluster/cluster; return stdout; raise with its stderr on failure."""
    proc = subprocess.run(
        [str(DRIVER), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"`cluster {' '.join(args)}` failed (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()}\n{proc.stdout.strip()}"
        )
    return proc.stdout


def build_paths() -> dict[str, str]:
    """Build (or reuse) the binaries; return the NAME=PATH lines of `cluster build`."""
    out = run_driver("build", timeout=3600)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@dataclass
class Cluster:
    """A running local control plane.

    Attributes: state_dir, kubeconfig, kubectl_path, helm_path, bin_dir, env (os.environ plus
    KUBECONFIG and bin_dir first on PATH: give it to subprocesses such as the operator), nodes,
    racks ({rack: [node, ...]}), gpus_per_node, kueue, zone_key, rack_key, nvlink_key,
    gpu_resource, shared_storage_class, default_storage_class, pvs, info (cluster.json).
    """

    state_dir: Path
    info: dict[str, Any]
    owned: bool = True
    _down: bool = field(default=False, repr=False)
    _reader: Reader | None = field(default=None, repr=False)

    # -- identity -----------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return Path(self.info["kubeconfig"])

    @property
    def server(self) -> str:
        return str(self.info["server"])

    @property
    def bin_dir(self) -> Path:
        return Path(self.info["bin_dir"])

    @property
    def kubectl_path(self) -> Path:
        return Path(self.info["kubectl"])

    @property
    def helm_path(self) -> Path:
        return Path(self.info["helm"])

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    @property
    def nodes(self) -> list[str]:
        return list(self.info["nodes"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.info["gpus_per_node"])

    @property
    def kueue(self) -> bool:
        return bool(self.info["kueue"])

    @property
    def zone_key(self) -> str:
        return str(self.info["labels"]["zone"])

    @property
    def rack_key(self) -> str:
        return str(self.info["labels"]["rack"])

    @property
    def nvlink_key(self) -> str:
        return str(self.info["labels"]["nvlink"])

    @property
    def gpu_resource(self) -> str:
        return str(self.info["labels"]["gpu_resource"])

    @property
    def default_storage_class(self) -> str:
        return str(self.info["storage_classes"]["default"])

    @property
    def shared_storage_class(self) -> str:
        return str(self.info["storage_classes"]["shared"])

    @property
    def pvs(self) -> list[str]:
        return list(self.info["pvs"])

    @property
    def racks(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node in self.kubectl_json("get", "nodes")["items"]:
            rack = node["metadata"]["labels"].get(self.rack_key)
            if rack:
                out.setdefault(rack, []).append(node["metadata"]["name"])
        return {k: sorted(v) for k, v in sorted(out.items())}

    # -- tools --------------------------------------------------------------------------------
    @property
    def reader(self) -> Reader | None:
        """The in-process answer to `kubectl get -o json` (kubeget.py); None without the
        cluster's admin certificate."""
        if self._reader is None:
            pki = self.state_dir / "pki"
            if (pki / "admin.key").is_file():
                self._reader = Reader(
                    self.server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key"
                )
        return self._reader

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster. With check=True a failure raises with its stderr.
        A `get ... -o json` is answered in-process (kubeget.py), the way kubectl would."""
        answer = self.reader.get(args) if input is None and self.reader is not None else None
        if answer is not None:
            proc = subprocess.CompletedProcess(
                ["kubectl", *args], answer.returncode, answer.stdout, answer.stderr
            )
        else:
            proc = subprocess.run(
                [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}"
            )
        return proc

    def wait_crd_established(self, name: str, timeout: float = 60) -> None:
        """Wait for a CRD's Established condition. A CRD the apiserver has just stored has no
        status.conditions yet, and `kubectl wait` then fails at once ("accessor error: <nil>")
        instead of waiting, so the condition is polled here."""
        deadline = time.monotonic() + timeout
        while True:
            conditions = self.kubectl_json("get", f"crd/{name}").get("status", {}).get("conditions")
            if any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in conditions or ()
            ):
                return
            assert time.monotonic() < deadline, f"CRD {name} not Established in {timeout:.0f} s"
            time.sleep(0.5)

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: str | dict[str, Any], namespace: str | None = None) -> None:
        """kubectl apply -f - (a YAML/JSON string or one object as a dict)."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        ns = [f"--namespace={namespace}"] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", input=text)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.helm_path), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def driver(self, *args: str, timeout: float = 120) -> str:
        """Run a `cluster` subcommand against this cluster's state dir."""
        return run_driver(*args, "--state", str(self.state_dir), timeout=timeout)

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for this cluster (the `kubernetes` package)."""
        from kubernetes import config

        return config.new_client_from_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=str(self.kubeconfig)
        )

    # -- faults -------------------------------------------------------------------------------
    def fail_pod(
        self,
        namespace: str,
        name: str,
        exit_code: int = 1,
        reason: str = "Error",
        wait: bool = True,
    ) -> None:
        """Running -> Failed with this container exit code (kwok chaos stage)."""
        args = [
            "fail-pod",
            f"{namespace}/{name}",
            "--exit-code",
            str(exit_code),
            "--reason",
            reason,
        ]
        self.driver(*args, *([] if wait else ["--no-wait"]))

    def complete_pod(self, namespace: str, name: str, wait: bool = True) -> None:
        """Running -> Succeeded with exit code 0."""
        self.driver("complete-pod", f"{namespace}/{name}", *([] if wait else ["--no-wait"]))

    def evict_pod(self, namespace: str, name: str) -> None:
        """Evict through the Eviction API: the pod gets DisruptionTarget, then goes away."""
        self.driver("evict-pod", f"{namespace}/{name}")

    def fail_node(self, name: str, wait: bool = True) -> None:
        """Node Ready=False (kwok chaos stage); after the not-ready toleration (30 s) the
        taint-eviction controller evicts its pods with DisruptionTarget."""
        self.driver("fail-node", name, *([] if wait else ["--no-wait"]))

    def recover_node(self, name: str, wait: bool = True) -> None:
        self.driver("recover-node", name, *([] if wait else ["--no-wait"]))

    # -- waiting ------------------------------------------------------------------------------
    @staticmethod
    def wait(
        predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.25, what: str = ""
    ) -> Any:
        """Poll until predicate() returns something truthy; return it. Fails on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
            time.sleep(interval)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.kubectl_json("get", "pod", "-n", namespace, name)
        return result

    def pod_phase(self, namespace: str, name: str) -> str:
        return str(self.pod(namespace, name).get("status", {}).get("phase", ""))

    def wait_pod_phase(
        self, namespace: str, name: str, phase: str, timeout: float = 30
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            return pod if pod.get("status", {}).get("phase") == phase else None

        result: dict[str, Any] = self.wait(check, timeout, what=f"pod {namespace}/{name} {phase}")
        return result

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close this object's API connections (the cluster keeps running)."""
        if self._reader is not None:
            self._reader.close()

    def down(self) -> None:
        self.close()
        if self.owned and not self._down:
            run_driver("down", "--state", str(self.state_dir), timeout=120)
        self._down = True


def pod_summary(items: list[dict[str, Any]]) -> list[str]:
    """Each pod's phase, node, the scheduler's PodScheduled message and its containers' states."""
    lines = []
    for p in items:
        st = p.get("status") or {}
        cond = next((x for x in st.get("conditions") or [] if x.get("type") == "PodScheduled"), {})
        states = {
            x.get("name"): x.get("state")
            for x in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
        }
        lines.append(
            f"pod {p['metadata']['name']}: {st.get('phase')} on "
            f"{(p.get('spec') or {}).get('nodeName')}: {cond.get('message', '')} {states}"
        )
    return lines


def start_cluster(state_dir: Path, args: Sequence[str], timeout: float = 600) -> Cluster:
    """`cluster up`; on failure the driver has already stopped what it started."""
    out = run_driver("up", "--state", str(state_dir), *args, timeout=timeout)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"KUBECONFIG=\S+", last), f"unexpected last line of `cluster up`: {last!r}"
    info = json.loads((state_dir / "cluster.json").read_text())
    return Cluster(state_dir=state_dir, info=info)


def _running(state_dir: Path) -> bool:
    if not (state_dir / "cluster.json").is_file():
        return False
    out = subprocess.run(
        [str(DRIVER), "status", "--state", str(state_dir)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    lines = [line for line in out.splitlines() if " pid " in line]
    return bool(lines) and all(line.rstrip().endswith("running") for line in lines)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    return int(raw) if raw.strip() else default
