"""`cluster build`: every Go binary of the local cluster, in as few `go build`s as possible.

The binaries are a list of tools (`TOOLS`). Each names the Go module it is built in, its package,
the pin in versions.env it follows, its version ldflags and the sources of ours it contains. The
tools of one module are compiled by ONE `go build -o bin/ pkg1 pkg2 ...`, so the packages they
share are compiled once:

- the k8s module (`go.mod`, k8s.io/kubernetes with its staging modules): the multi-call binary
  `k8s` (apiserver, controller-manager, scheduler, kubectl, etcd AND the kubelet, which shares
  most of k8s.io/kubernetes with them) and the static `pause`;
- the tools module (`tools/go.mod`): Kueue, kwok, helm and CoreDNS, which all build against
  k8s.io/client-go 0.36: client-go, apimachinery, controller-runtime, grpc and otel are compiled
  once for the four of them instead of once each.

Another tool is one more `GoTool` in `TOOLS` (its own module directory, or one of these two when
its dependencies agree with theirs), plus, if it needs files from its module zip, one more entry
in `ASSETS`. Its pin goes in versions.env. Every tool contributes a part to the cache key.

Python standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import die, log

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.env"
TOOLS_DIR = HERE / "tools"

# Bump when the way binaries are built changes (flags, layout), to invalidate old caches.
RECIPE = "6"
BUILD_TAGS = "selinux,notest,grpcnotrace"
K8S_MODULE = "k8s.io/kubernetes"

COMPONENTS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "etcd",
    "kubelet",
)

# kwok stages taken unchanged from the module zip (kustomize/stage/...).
KWOK_ZIP_STAGES = (
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "node/chaos/node-not-ready.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/chaos/pod-container-running-failed.yaml",
)

Versions = dict[str, str]

# Pins of tools built on demand, outside TOOLS and in cache directories of their own (jobset.py:
# the JobSet peer of benchmarks/peer_jobset.py). Left out of the control plane's cache key, so
# bumping one rebuilds only that tool.
ON_DEMAND_PINS = ("JOBSET_VERSION",)


def read_versions() -> Versions:
    if not VERSIONS_FILE.is_file():
        die(f"{VERSIONS_FILE} is missing")
    out: Versions = {}
    for raw in VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            die(f"{VERSIONS_FILE}: bad line {raw!r}")
        out[key.strip()] = value.strip()
    for tool in TOOLS:
        key = tool.version_key
        if key and not re.fullmatch(r"v\d+\.\d+\.\d+", out.get(key, "")):
            die(f"{VERSIONS_FILE}: {key} must be set to a version like v1.2.3")
    return out


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "megatron-operator" / "cluster"


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    return env


def run_go(args: Sequence[str], cwd: Path | None = None) -> str:
    if shutil.which("go") is None:
        die("the Go toolchain (`go`) is not on PATH; it is needed to build the control plane")
    cmd = ["go", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=go_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        die(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stderr.strip()[-4000:]}")
    return proc.stdout


def module_info(path: str, version: str) -> dict[str, Any]:
    out = run_go(["mod", "download", "-json", f"{path}@{version}"], cwd=Path(tempfile.gettempdir()))
    info: dict[str, Any] = json.loads(out)
    if info.get("Error"):
        die(f"cannot download {path}@{version}: {info['Error']}")
    return info


# ----------------------------------------------------------------------------------------------
# version stamps


def ldflags_k8s(v: Versions, build_date: str) -> list[str]:
    version = v["K8S_VERSION"]
    major, minor, _patch = version.lstrip("v").split(".")
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={build_date}",
        ]
    return flags


def helm_module(v: Versions) -> str:
    return f"helm.sh/helm/v{v['HELM_VERSION'].lstrip('v').split('.')[0]}"


def ldflags_helm(v: Versions, _build_date: str) -> list[str]:
    mod = helm_module(v)
    k8s_major, k8s_minor, _ = v["K8S_VERSION"].lstrip("v").split(".")
    flags = [
        f"-X {mod}/internal/version.version={v['HELM_VERSION']}",
        f"-X {mod}/internal/version.gitTreeState=clean",
    ]
    chartutil = "pkg/chartutil" if mod.endswith("/v3") else "pkg/chart/common"
    for pkg in (f"{mod}/{chartutil}", f"{mod}/pkg/lint/rules"):
        flags += [f"-X {pkg}.k8sVersionMajor={k8s_major}", f"-X {pkg}.k8sVersionMinor={k8s_minor}"]
    return flags


def no_ldflags(_v: Versions, _build_date: str) -> list[str]:
    return []


# ----------------------------------------------------------------------------------------------
# the tools


@dataclass(frozen=True)
class GoTool:
    """One binary of bin/. `package` is what `go build` is given (a path inside the module,
    or a dependency's import path: then `go_module` is that dependency, kept at the version
    `version_key` names in versions.env). The binary is named after the package's last element,
    which must be `name`."""

    name: str
    module_dir: Path
    package: Callable[[Versions], str]
    version_key: str | None = None
    go_module: Callable[[Versions], str] | None = None
    tags: str = ""
    ldflags: Callable[[Versions, str], list[str]] = no_ldflags
    links: tuple[str, ...] = ()  # more names for a multi-call binary
    sources: tuple[str, ...] = ()  # our own package directories (relative to module_dir)

    def key_part(self, v: Versions) -> str:
        return f"{self.name}-{v[self.version_key]}" if self.version_key else ""


def _const(text: str) -> Callable[[Versions], str]:
    return lambda _v: text


TOOLS: list[GoTool] = [
    GoTool(
        "k8s",
        HERE,
        _const("./k8s"),
        version_key="K8S_VERSION",
        tags=BUILD_TAGS,
        ldflags=ldflags_k8s,
        links=COMPONENTS,
        sources=("k8s",),
    ),
    # The real nodes' sandbox image holds this binary alone.
    GoTool("pause", HERE, _const("./pause"), tags=BUILD_TAGS, sources=("pause",)),
    GoTool(
        "kueue",
        TOOLS_DIR,
        _const("sigs.k8s.io/kueue/cmd/kueue"),
        version_key="KUEUE_VERSION",
        go_module=_const("sigs.k8s.io/kueue"),
        ldflags=lambda v, _d: [f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={v['KUEUE_VERSION']}"],
    ),
    GoTool(
        "kwok",
        TOOLS_DIR,
        _const("sigs.k8s.io/kwok/cmd/kwok"),
        version_key="KWOK_VERSION",
        go_module=_const("sigs.k8s.io/kwok"),
        ldflags=lambda v, _d: [f"-X sigs.k8s.io/kwok/pkg/consts.Version={v['KWOK_VERSION']}"],
    ),
    GoTool(
        "helm",
        TOOLS_DIR,
        lambda v: f"{helm_module(v)}/cmd/helm",
        version_key="HELM_VERSION",
        go_module=helm_module,
        ldflags=ldflags_helm,
    ),
    # Only the plugins the cluster uses (tools/coredns/main.go); its kubernetes plugin shares
    # client-go with the three above.
    GoTool(
        "coredns",
        TOOLS_DIR,
        _const("./coredns"),
        version_key="COREDNS_VERSION",
        go_module=_const("github.com/coredns/coredns"),
        sources=("coredns",),
    ),
]


@dataclass
class Asset:
    """Files a cluster needs from a tool's module zip, copied into the build directory."""

    name: str  # directory under the build root
    copy: Callable[[Versions, Path], None]


def copy_kueue_crds(v: Versions, dst: Path) -> None:
    kueue_dir = Path(module_info("sigs.k8s.io/kueue", v["KUEUE_VERSION"])["Dir"])
    crds = sorted((kueue_dir / "config/components/crd/bases").glob("*.yaml"))
    if not crds:
        die(f"no Kueue CRDs found under {kueue_dir}/config/components/crd/bases")
    (dst / "crds").mkdir(parents=True)
    for crd in crds:
        shutil.copyfile(crd, dst / "crds" / crd.name)


def copy_kwok_stages(v: Versions, dst: Path) -> None:
    kwok_dir = Path(module_info("sigs.k8s.io/kwok", v["KWOK_VERSION"])["Dir"])
    for rel in KWOK_ZIP_STAGES:
        src = kwok_dir / "kustomize" / "stage" / rel
        if not src.is_file():
            die(f"kwok stage {rel} is missing from {kwok_dir}")
        out = dst / "stages" / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)


ASSETS: list[Asset] = [Asset("kueue", copy_kueue_crds), Asset("kwok", copy_kwok_stages)]


# ----------------------------------------------------------------------------------------------
# go.mod files kept in step with versions.env


def staging_version(k8s_version: str) -> str:
    _major, minor, patch = k8s_version.lstrip("v").split(".")
    return f"v0.{minor}.{patch}"


def sync_k8s_mod(v: Versions) -> None:
    """Keep go.mod in step with K8S_VERSION: require it, replace every staging module.

    The replace list is derived from k8s.io/kubernetes' own .mod file (its ./staging replaces).
    Does nothing when go.mod already requires the pinned version.
    """
    gomod = HERE / "go.mod"
    want = v["K8S_VERSION"]
    text = gomod.read_text() if gomod.exists() else ""
    if re.search(rf"^\s*(require\s+)?{re.escape(K8S_MODULE)} {re.escape(want)}\s*$", text, re.M):
        return
    log(f"go.mod does not require {K8S_MODULE} {want}: regenerating it (commit the result)")
    info = module_info(K8S_MODULE, want)
    upstream = Path(info["GoMod"]).read_text()
    staging = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", upstream, re.M)))
    if not staging:
        die(f"found no staging replaces in {info['GoMod']}")
    sv = staging_version(want)
    lines = [
        "module megatron-operator/tests/cluster",
        "",
        "go 1.24.0",
        "",
        "godebug default=go1.24",
        "",
        f"require {K8S_MODULE} {want}",
        "",
        "// Every staging module of k8s.io/kubernetes, derived from its .mod file by `cluster build`.",
        "replace (",
        *[f"\t{m} => {m} {sv}" for m in staging],
        ")",
        "",
    ]
    gomod.write_text("\n".join(lines))
    (HERE / "go.sum").unlink(missing_ok=True)
    run_go(["mod", "tidy"], cwd=HERE)


def sync_tool_pins(v: Versions) -> None:
    """Keep each dependency-built tool's module at its pin: `go get MODULE@VERSION` where the
    module's go.mod requires another version, then `go mod tidy` (commit the result).

    The dependency's own go.sum lines are merged in first: Kueue's graph has a module
    (sigs.k8s.io/scheduler-library v0.1.0-alpha1) that the checksum database does not list, so
    its hash can only come from Kueue's go.sum.
    """
    changed: set[Path] = set()
    for tool in TOOLS:
        if tool.go_module is None or tool.version_key is None:
            continue
        mod, want = tool.go_module(v), v[tool.version_key]
        gomod = tool.module_dir / "go.mod"
        pattern = rf"^\s*(require\s+)?{re.escape(mod)} {re.escape(want)}(\s*//.*)?$"
        if re.search(pattern, gomod.read_text(), re.M):
            continue
        log(f"{gomod.relative_to(HERE)} does not require {mod} {want}: updating it (commit it)")
        info = module_info(mod, want)
        theirs = Path(info["Dir"]) / "go.sum"
        if theirs.is_file():
            gosum = tool.module_dir / "go.sum"
            lines = set(gosum.read_text().splitlines()) if gosum.exists() else set()
            lines |= set(theirs.read_text().splitlines())
            gosum.write_text("\n".join(sorted(line for line in lines if line)) + "\n")
        run_go(["get", f"{mod}@{want}"], cwd=tool.module_dir)
        changed.add(tool.module_dir)
    for module_dir in sorted(changed):
        run_go(["mod", "tidy"], cwd=module_dir)


# ----------------------------------------------------------------------------------------------
# the build directory


def pins_digested() -> bytes:
    """versions.env as the control plane's cache key sees it: without the on-demand pins."""
    lines = VERSIONS_FILE.read_bytes().splitlines(keepends=True)
    skip = tuple(f"{k}=".encode() for k in ON_DEMAND_PINS)
    return b"".join(line for line in lines if not line.startswith(skip))


def source_digest(v: Versions) -> str:
    """Digest of everything that determines the binaries: pins, go.mod/go.sum, our Go sources,
    the tools' packages, tags and version flags, and the recipe."""
    h = hashlib.sha256(RECIPE.encode() + pins_digested())
    files: set[Path] = set()
    for tool in TOOLS:
        h.update(
            f"|{tool.name}|{tool.package(v)}|{tool.tags}|{tool.ldflags(v, '')}|{tool.links}".encode()
        )
        files |= {tool.module_dir / "go.mod", tool.module_dir / "go.sum"}
        for src in tool.sources:
            files |= set((tool.module_dir / src).glob("*.go"))
    for f in sorted(files):
        h.update(str(f.relative_to(HERE)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def build_key(v: Versions) -> str:
    parts = [p for p in (t.key_part(v) for t in TOOLS) if p]
    return "_".join([*parts, source_digest(v)])


@dataclass(frozen=True)
class Build:
    root: Path
    names: tuple[str, ...] = field(
        default_factory=lambda: tuple(n for t in TOOLS for n in (t.name, *t.links))
    )

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def kueue_crds(self) -> Path:
        return self.root / "kueue" / "crds"

    @property
    def kwok_stages(self) -> Path:
        return self.root / "kwok" / "stages"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def complete(self) -> bool:
        return self.manifest.is_file() and all(
            os.access(self.binary(n), os.X_OK) for n in self.names
        )

    def paths(self) -> dict[str, str]:
        out = {"cache_dir": str(self.root), "bin_dir": str(self.bin_dir)}
        for name in self.names:
            out[name] = str(self.binary(name))
        out["kueue_crds"] = str(self.kueue_crds)
        out["kwok_stages"] = str(self.kwok_stages)
        return out


def current_build() -> Build:
    return Build(cache_root() / build_key(read_versions()))


def require_build() -> Build:
    build = current_build()
    if not build.complete():
        die(
            "the cluster's binaries for the pinned versions are not built "
            f"(expected under {build.root}).\nRun: {HERE / 'cluster'} build"
        )
    return build


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build holding {path}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_groups(v: Versions) -> dict[tuple[Path, str], list[GoTool]]:
    groups: dict[tuple[Path, str], list[GoTool]] = {}
    for tool in TOOLS:
        groups.setdefault((tool.module_dir, tool.tags), []).append(tool)
    return groups


def do_build() -> Build:
    v = read_versions()
    sync_k8s_mod(v)
    sync_tool_pins(v)
    build = Build(cache_root() / build_key(v))
    if build.complete():
        return build
    with file_lock(cache_root() / ".build.lock"):
        if build.complete():
            return build
        started = time.monotonic()
        for stale in cache_root().glob("*.partial"):  # left by interrupted builds
            shutil.rmtree(stale, ignore_errors=True)
        tmp = build.root.with_name(build.root.name + ".partial")
        (tmp / "bin").mkdir(parents=True)
        k8s_info = module_info(K8S_MODULE, v["K8S_VERSION"])
        build_date = json.loads(Path(k8s_info["Info"]).read_text()).get("Time", "")
        timings: dict[str, float] = {}
        for (module_dir, tags), tools in build_groups(v).items():
            t = time.monotonic()
            names = ", ".join(tool.name for tool in tools)
            log(f"building {names} (one `go build` in {module_dir.relative_to(HERE.parent)})")
            ldflags = ["-s", "-w"] + [f for tool in tools for f in tool.ldflags(v, build_date)]
            run_go(
                [
                    "build",
                    "-trimpath",
                    *(["-tags", tags] if tags else []),
                    "-ldflags",
                    " ".join(ldflags),
                    "-o",
                    str(tmp / "bin") + "/",
                    *(tool.package(v) for tool in tools),
                ],
                cwd=module_dir,
            )
            for tool in tools:
                if not (tmp / "bin" / tool.name).is_file():
                    die(f"`go build` of {tool.package(v)} made no bin/{tool.name}")
                for link in tool.links:
                    (tmp / "bin" / link).symlink_to(tool.name)
            timings[names] = time.monotonic() - t
            log(f"built {names} in {timings[names]:.0f} s")
        for asset in ASSETS:
            asset.copy(v, tmp / asset.name)
        manifest = {
            "versions": v,
            "key": build.root.name,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": {k: round(s, 1) for k, s in timings.items()},
            "total_seconds": round(time.monotonic() - started, 1),
            "go": run_go(["env", "GOVERSION"]).strip(),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(build.root, ignore_errors=True)
        tmp.rename(build.root)
        log(f"build finished in {manifest['total_seconds']} s")
    return build
