"""How a real node of tests/cluster best gets the trainer image: imported from the OCI archive
(what `cluster up --real-nodes` does), or pulled from a local registry as a real cluster's nodes
pull.

Starts N containerd instances (one per simulated node, each with its own root, as the real
nodes have) and times, for all N at once:
  import  `ctr images import` of the archive (`cluster images` makes it);
  pull    `ctr images pull --plain-http` from a read-only OCI registry on 127.0.0.1 serving the
          same image (the archive unpacked; a small HTTP server in this script).
Both end with the image unpacked into each node's snapshotter, which is what a pod needs.
Every round starts from empty containerd roots. Root and containerd (Debian) needed.

Run: python benchmarks/image_import_vs_pull.py [--nodes 3] [--image trainer]
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "cluster" / "cluster"


def images() -> dict[str, str]:
    out = subprocess.run([str(DRIVER), "images"], capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


class Registry(http.server.BaseHTTPRequestHandler):
    """The read side of the OCI distribution API over one OCI image layout directory."""

    layout: Path
    refs: dict[str, str]  # "name:tag" -> manifest digest

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = self.path.split("?")[0]
        if path in ("/v2/", "/v2"):
            self._send(200, b"{}", "application/json", body)
            return
        parts = path.removeprefix("/v2/").rsplit("/", 2)
        if len(parts) != 3 or parts[1] not in ("manifests", "blobs"):
            self._send(404, b"", "text/plain", body)
            return
        name, kind, ref = parts
        digest = ref if ref.startswith("sha256:") else self.refs.get(f"{name}:{ref}", "")
        blob = self.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
        if not digest or not blob.is_file():
            self._send(404, b"", "text/plain", body)
            return
        media = "application/octet-stream"
        if kind == "manifests":
            media = json.loads(blob.read_bytes()).get("mediaType", media)
        self.send_response(200)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(blob.stat().st_size))
        self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if body:
            with blob.open("rb") as f:
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def _send(self, code: int, data: bytes, media: str, body: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def serve(layout: Path, ref: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    index = json.loads((layout / "index.json").read_text())
    manifest = index["manifests"][0]["digest"]
    repo = ref.split("/", 1)[
        1
    ]  # localhost/megatron-operator/trainer:KEY -> megatron-.../trainer:KEY
    handler = type("H", (Registry,), {"layout": layout, "refs": {repo: manifest}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}/{repo}"


def containerd(root: Path) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True)
    cfg = root / "config.toml"
    cfg.write_text(
        f'version = 2\nroot = "{root / "root"}"\nstate = "{root / "state"}"\n'
        f'[grpc]\n  address = "{root / "sock"}"\n[ttrpc]\n  address = "{root / "ttrpc"}"\n'
    )
    proc = subprocess.Popen(
        ["containerd", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while subprocess.run(ctr(root, "version"), capture_output=True, check=False).returncode:
        if time.monotonic() > deadline or proc.poll() is not None:
            sys.exit(f"containerd in {root} did not start")
        time.sleep(0.2)
    return proc


def ctr(root: Path, *args: str) -> list[str]:
    return ["ctr", "--address", str(root / "sock"), "-n", "k8s.io", *args]


def unmount_under(root: Path) -> None:
    prefix = str(root) + "/"
    points = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(prefix)
    ]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def round_(work: Path, nodes: int, argv_for: Any) -> float:
    """Start `nodes` containerds, run argv_for(root) in all at once, return the seconds."""
    roots = [work / f"node-{i}" for i in range(nodes)]
    daemons = [containerd(r) for r in roots]
    try:
        t = time.monotonic()
        procs = [subprocess.Popen(argv_for(r), stdout=subprocess.DEVNULL) for r in roots]
        codes = [p.wait() for p in procs]
        seconds = time.monotonic() - t
        if any(codes):
            sys.exit(f"failed: exit codes {codes}")
        return seconds
    finally:
        for d in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.pid, signal.SIGKILL)
            d.wait()
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--image", default="trainer", choices=("trainer", "operator"))
    p.add_argument("--archive", help="an OCI archive instead of `cluster images`' (with --ref)")
    p.add_argument("--ref", help="the image reference inside --archive")
    args = p.parse_args()
    if os.geteuid() != 0 or shutil.which("containerd") is None:
        sys.exit("needs root and containerd (apt-get install -y containerd)")
    if args.archive:
        archive, ref = Path(args.archive), args.ref
    else:
        built = images()
        archive, ref = Path(built[f"{args.image}_archive"]), built[f"{args.image}_image"]
    size = archive.stat().st_size
    print(f"{ref}: archive {size / 2**30:.2f} GiB; {args.nodes} nodes at once")
    with tempfile.TemporaryDirectory(prefix="import-vs-pull-", dir="/tmp") as tmp:
        base = Path(tmp)
        t = time.monotonic()
        layout = base / "layout"
        with tarfile.open(archive) as tar:
            tar.extractall(layout, filter="data")
        print(f"registry layout unpacked from the archive in {time.monotonic() - t:.0f} s")
        server, pull_ref = serve(layout, ref)
        try:
            imported = round_(
                base / "import",
                args.nodes,
                lambda r: ctr(r, "images", "import", "--all-platforms", str(archive)),
            )
            print(f"import: {imported:.0f} s")
            pulled = round_(
                base / "pull",
                args.nodes,
                lambda r: ctr(r, "images", "pull", "--plain-http", pull_ref),
            )
            print(f"pull:   {pulled:.0f} s")
        finally:
            server.shutdown()
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().split()[:3]}")


if __name__ == "__main__":
    socket.setdefaulttimeout(600)
    main()
