"""JobSet (sigs.k8s.io/jobset) for the local cluster: built on demand, run with its webhooks.

`cluster build --jobset` and `cluster up --jobset` call `ensure_build()`; `up --jobset` then calls
`start()`. JobSet is the peer `benchmarks/peer_jobset.py` measures the operator against; nothing
else needs it, so its build (a module graph of its own, Kubernetes 0.36 libraries) lives in a
cache directory of its own, `<control-plane key>_jobset-<version>-<digest>`, and the kwok-only
tests and CI never pay for it. That is also why it is not one of gobuild.TOOLS (which every
`cluster build` builds, and whose pins make the control plane's cache key): its pin,
JOBSET_VERSION, is left out of that key (gobuild.ON_DEMAND_PINS), so a JobSet bump rebuilds only
JobSet. It is built with gobuild's helpers, from a tool module of its own (`jobset/go.mod`,
a `tool` directive as `tools/` has), not with `go install sigs.k8s.io/jobset@V`: the module proxy
here refuses version lists, which `go install` asks for.

JobSet runs as it is deployed, webhooks included: the JobSet defaulting and validating webhooks and
the pod webhooks (exclusive placement), served from 127.0.0.1 with the cluster's serving
certificate (its SANs include 127.0.0.1) and registered with `clientConfig.url` and the cluster
CA, so no in-cluster Service or cert-manager is needed. Internal certificate management is off
(the certificates are ours), leader election is off, metrics are off.

Python standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import die, log
from gobuild import cache_root, file_lock, module_info, read_versions, run_go

HERE = Path(__file__).resolve().parent
JOBSET_DIR = HERE / "jobset"
MODULE = "sigs.k8s.io/jobset"
# Bump when the way JobSet is built or laid out changes.
RECIPE = "1"
GROUP = "jobset.x-k8s.io"
CRD_NAME = f"jobsets.{GROUP}"
WEBHOOK_LABEL = "jobset.sigs.k8s.io/jobset-name"  # the pod webhooks' objectSelector


def version(versions: dict[str, str]) -> str:
    v = versions.get("JOBSET_VERSION", "")
    if not re.fullmatch(r"v\d+\.\d+\.\d+", v):
        die("versions.env: JOBSET_VERSION must be set to a version like v0.12.0")
    return v


def sync_mod(versions: dict[str, str]) -> None:
    """Keep jobset/go.mod (a tool module building sigs.k8s.io/jobset) on JOBSET_VERSION; its
    go.sum starts from JobSet's own. Does nothing when it already requires the pinned version."""
    gomod = JOBSET_DIR / "go.mod"
    want = version(versions)
    text = gomod.read_text() if gomod.exists() else ""
    if re.search(rf"^\s*(require\s+)?{re.escape(MODULE)} {re.escape(want)}(\s*//.*)?$", text, re.M):
        return
    log(f"jobset/go.mod does not require {MODULE} {want}: regenerating it (commit the result)")
    info = module_info(MODULE, want)
    go_line = re.search(r"^go (\S+)", Path(info["GoMod"]).read_text(), re.M)
    JOBSET_DIR.mkdir(exist_ok=True)
    gomod.write_text(
        "module megatron-operator/tests/cluster/jobset\n\n"
        f"go {go_line.group(1) if go_line else '1.26.0'}\n\n"
        f"tool {MODULE}\n\n"
        f"require {MODULE} {want}\n"
    )
    shutil.copyfile(Path(info["Dir"]) / "go.sum", JOBSET_DIR / "go.sum")
    (JOBSET_DIR / "go.sum").chmod(0o644)
    run_go(["mod", "tidy"], cwd=JOBSET_DIR)


def digest(versions: dict[str, str]) -> str:
    h = hashlib.sha256(f"{RECIPE}\0{version(versions)}\0".encode())
    for f in (JOBSET_DIR / "go.mod", JOBSET_DIR / "go.sum"):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class JobSetBuild:
    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "jobset"

    @property
    def crds(self) -> Path:
        return self.root / "crds"

    def complete(self) -> bool:
        return (self.root / "manifest.json").is_file() and os.access(self.binary, os.X_OK)

    def paths(self) -> dict[str, str]:
        return {"jobset": str(self.binary), "jobset_crds": str(self.crds)}


def build_of(control_plane_root: Path, versions: dict[str, str]) -> JobSetBuild:
    name = f"{control_plane_root.name}_jobset-{version(versions)}-{digest(versions)}"
    return JobSetBuild(control_plane_root.with_name(name))


def ensure_build(control_plane_root: Path) -> JobSetBuild:
    """Build (or reuse) the JobSet controller and copy its CRD from the module zip."""
    versions = read_versions()
    sync_mod(versions)
    built = build_of(control_plane_root, versions)
    if built.complete():
        return built
    with file_lock(cache_root() / ".build.lock"):
        if built.complete():
            return built
        started = time.monotonic()
        tmp = built.root.with_name(built.root.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "bin").mkdir(parents=True)
        want = version(versions)
        log(f"building jobset {want} (the JobSet peer; cold: several minutes on 2 cores)")
        run_go(
            [
                "build",
                "-trimpath",
                "-ldflags",
                f"-s -w -X {MODULE}/pkg/version.GitVersion={want}",
                "-o",
                str(tmp / "bin" / "jobset"),
                MODULE,
            ],
            cwd=JOBSET_DIR,
        )
        src = Path(module_info(MODULE, want)["Dir"]) / "config/components/crd/bases"
        crds = sorted(src.glob("*.yaml"))
        if not crds:
            die(f"no JobSet CRD found under {src}")
        (tmp / "crds").mkdir()
        for crd in crds:
            shutil.copyfile(crd, tmp / "crds" / crd.name)
        manifest = {
            "version": want,
            "key": built.root.name,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.monotonic() - started, 1),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(built.root, ignore_errors=True)
        tmp.rename(built.root)
        log(f"jobset build finished in {manifest['seconds']} s")
    return built


def config(state: Path, ports: dict[str, int]) -> Path:
    """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1): its own certificates off, the
    webhook server on loopback with the cluster's serving certificate, no leader election.
    The API client keeps JobSet's defaults (QPS 500, burst 500)."""
    certs = state / "jobset-certs"
    certs.mkdir(exist_ok=True)
    for name in ("crt", "key"):
        shutil.copyfile(state / "pki" / f"serving.{name}", certs / f"tls.{name}")
    path = state / "jobset.yaml"
    path.write_text(
        "apiVersion: config.jobset.x-k8s.io/v1alpha1\n"
        "kind: Configuration\n"
        "webhook:\n"
        "  host: 127.0.0.1\n"
        f"  port: {ports['jobset_webhook']}\n"
        f"  certDir: {certs}\n"
        "metrics:\n"
        '  bindAddress: "0"\n'
        "health:\n"
        f"  healthProbeBindAddress: 127.0.0.1:{ports['jobset_health']}\n"
        "leaderElection:\n"
        "  leaderElect: false\n"
        "internalCertManagement:\n"
        "  enable: false\n"
    )
    return path


def webhook_configurations(port: int, ca_bundle: str) -> list[tuple[str, dict[str, Any]]]:
    """JobSet's webhook configurations (config/components/webhook: manifests.yaml with its
    patches: the pod webhooks only see pods labelled with a JobSet name), served at a URL."""

    def hook(name: str, path: str, resource: str, group: str, version_: str) -> dict[str, Any]:
        ops = ["CREATE", "UPDATE"] if name == "vjobset.kb.io" else ["CREATE"]
        out: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version_],
                    "operations": ops,
                    "resources": [resource],
                }
            ],
        }
        if resource == "pods":
            out["objectSelector"] = {
                "matchExpressions": [{"key": WEBHOOK_LABEL, "operator": "Exists"}]
            }
        return out

    api = "/apis/admissionregistration.k8s.io/v1"
    return [
        (
            f"{api}/mutatingwebhookconfigurations",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "jobset-mutating-webhook-configuration"},
                "webhooks": [
                    hook(
                        "mjobset.kb.io",
                        "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                        "jobsets",
                        GROUP,
                        "v1alpha2",
                    ),
                    hook("mpod.kb.io", "/mutate--v1-pod", "pods", "", "v1"),
                ],
            },
        ),
        (
            f"{api}/validatingwebhookconfigurations",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "jobset-validating-webhook-configuration"},
                "webhooks": [
                    hook(
                        "vjobset.kb.io",
                        "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                        "jobsets",
                        GROUP,
                        "v1alpha2",
                    ),
                    hook("vpod.kb.io", "/validate--v1-pod", "pods", "", "v1"),
                ],
            },
        ),
    ]


def start(
    built: JobSetBuild,
    state: Path,
    kubeconfig: Path,
    kubectl: str,
    api: Any,
    ports: dict[str, int],
    spawn: Callable[..., Any],
    wait_for: Callable[..., None],
    http_ok: Callable[..., bool],
    conditions: Callable[[dict[str, Any]], dict[str, str]],
    b64: Callable[[Path], str],
    timeout: float,
    watch: Callable[[], None],
) -> Any:
    """Apply the CRD, start the controller, register its webhooks once it serves them."""
    proc = subprocess.run(
        [kubectl, f"--kubeconfig={kubeconfig}", "apply", "--server-side", "-f", str(built.crds)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        die(f"applying the JobSet CRD failed:\n{proc.stderr.strip()}")

    def established() -> bool:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        return conditions(crd).get("Established") == "True"

    wait_for("the JobSet CRD to be established", established, timeout, watch=watch)
    started = spawn(
        state,
        "jobset",
        [
            str(built.binary),
            f"--kubeconfig={kubeconfig}",
            f"--config={config(state, ports)}",
            "--zap-devel=false",
            "--zap-log-level=info",
        ],
    )
    # readyz passes once the webhook server listens (JobSet's own check).
    wait_for(
        "JobSet /readyz",
        lambda: http_ok(f"http://127.0.0.1:{ports['jobset_health']}/readyz", False),
        timeout,
        watch=watch,
    )
    ca = b64(state / "pki" / "ca.crt")
    for path, obj in webhook_configurations(ports["jobset_webhook"], ca):
        api.create(path, obj)
    return started


def ports_needed() -> Iterator[str]:
    yield from ("jobset_webhook", "jobset_health")
