"""The operator's memory with the heaviest pod templates, at 64 and 1,024 nodes.

One job's `spec.template` is carried by every pod of its gang. A 0.9 MB template once cost the
operator 13 MB per rendered pod and OOM-killed it at 64 nodes. Now the CRD caps every field of a
template, the template has a budget (4,096 values, 64 KiB) checked before planning, the pods are
rendered one at a time by their create calls and share the template, and pod lists are paged.

Cases, each with a fresh `mjob operator` process (RSS sampled every 50 ms) against the local
control plane, on kwok nodes (pods need no node to exist; they stay Pending):
- no template (the peer);
- the heaviest template the operator renders (at the budget: ~4,090 values, 64 KiB);
- the heaviest the apiserver stores (12,000 values, ~1.3 MB: every field within the CRD's caps,
  over the budget), which the operator refuses before planning;
- a restart of the operator with the 1,024 budget-template pods in place (the pod list on start).

Run: python benchmarks/operator_template_memory.py              (starts a small cluster)
     python benchmarks/operator_template_memory.py --state DIR  (reuse a running cluster)
     python benchmarks/operator_template_memory.py --nodes 64   (only the small gang)
Needs `tests/cluster/cluster build`. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "operator"))

import operator_cap_memory as cap  # noqa: E402

from megatron_operator.api.template import (  # noqa: E402
    MAX_TEMPLATE_BYTES,
    MAX_TEMPLATE_VALUES,
)
from tests.unit.template_cases import heavy_template  # noqa: E402

BUDGET = heavy_template(MAX_TEMPLATE_VALUES, MAX_TEMPLATE_BYTES)
STORED = heavy_template(16 * (256 * 3 + 6), 1_300_000)
# The report's template: 0.9 MB of DNS options, the most objects per byte a kept object allowed.
DNS = {"spec": {"dnsConfig": {"options": [{"name": f"opt{i:05d}"} for i in range(45_000)]}}}


class Operator(cap.Operator):
    """`mjob operator` watching one namespace, so each case sees only its own job; with
    `source`, the operator (and its CRD) of another source tree, for a before/after figure."""

    source: Path | None = None

    def start_in(self, ns: str, log: Path) -> None:
        tree = self.source or REPO
        if self.source is not None:
            self.env["PYTHONPATH"] = str(self.source / "operator")
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f",
            str(tree / "crds" / "megatronjobs.megatron.dev.yaml"),
        )  # fmt: skip
        for _ in range(60):  # the CRD's status may not exist yet
            try:
                self.kubectl("wait", "--for=condition=Established", "crd/megatronjobs.megatron.dev")
                break
            except RuntimeError:
                time.sleep(1)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "megatron_operator.cli.main", "operator",
                "--metrics-port=0", "--health-port=0", "--namespace", ns,
            ],
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        time.sleep(5)


def job(name: str, nodes: int, template: dict[str, Any] | None) -> dict[str, Any]:
    doc = cap.job(name, nodes)
    if template is not None:
        doc["spec"]["template"] = template
    return doc


def sampled(op: Operator, until: Callable[[], bool], settle: float) -> tuple[float, float]:
    """(seconds until `until()`, peak RSS MiB including `settle` seconds after)."""
    assert op.proc is not None
    proc = psutil.Process(op.proc.pid)
    peak = [proc.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    while not until():
        if op.proc.poll() is not None:
            raise RuntimeError("the operator exited")
        if time.monotonic() > t0 + 1800:
            raise TimeoutError("not done in 30 min")
        time.sleep(1)
    took = time.monotonic() - t0
    time.sleep(settle)
    stop.set()
    sampler.join()
    return took, peak[0] / 2**20


def phase(op: Operator, ns: str, name: str) -> str:
    out = op.kubectl("get", "mj", "-n", ns, name, "-o", "jsonpath={.status.phase}")
    return out.strip()


def case(
    op: Operator, state: Path, ns: str, name: str, nodes: int, template: Any, pods: bool
) -> tuple[float, float] | None:
    """(seconds, peak MiB), or None when the apiserver refuses the job."""
    op.kubectl("create", "namespace", ns)
    op.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(cap.PVC))
    op.start_in(ns, state / f"{ns}.log")
    try:
        try:
            doc = json.dumps(job(name, nodes, template))
            op.kubectl("create", "-n", ns, "-f", "-", input=doc)
        except RuntimeError:
            return None
        if pods:
            return sampled(op, lambda: op.pod_count(ns, name) >= nodes, 20)
        return sampled(op, lambda: phase(op, ns, name) == "Failed", 20)
    finally:
        op.stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state", help="a running cluster's state dir (default: start one)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 1024])
    parser.add_argument(
        "--operator-source",
        metavar="DIR",
        help="run the operator of another source tree (e.g. `git archive` of an older commit)",
    )
    args = parser.parse_args()
    started = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="megatron-tpl-"))
    if started:
        print(f"starting a 2-node cluster in {state} …", flush=True)
        subprocess.run(
            [str(cap.DRIVER), "up", "--state", str(state), "--nodes", "2", "--timeout", "600"],
            check=True,
            capture_output=True,
        )
    op = Operator(state)
    if args.operator_source:
        op.source = Path(args.operator_source).resolve()
        print(f"operator from {op.source}", flush=True)
    size = len(json.dumps(BUDGET, separators=(",", ":")))
    stored = len(json.dumps(STORED, separators=(",", ":")))
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {psutil.cpu_count()} cores, load "
        f"{psutil.getloadavg()[0]:.1f}; budget template {size:,} B, stored template {stored:,} B",
        flush=True,
    )
    try:
        for nodes in args.nodes:
            for ns, what, template, pods in (
                (f"tpl-none-{nodes}", "no template", None, True),
                (f"tpl-budget-{nodes}", "budget template", BUDGET, True),
                (f"tpl-stored-{nodes}", "1.3 MB template", STORED, False),
                (f"tpl-dns-{nodes}", "0.9 MB of DNS options", DNS, True),
            ):
                got = case(op, state, ns, "heavy", nodes, template, pods)
                if got is None:
                    print(f"{nodes:>5} pods, {what}: refused by the apiserver", flush=True)
                else:
                    done = "created" if pods else "failed"
                    print(
                        f"{nodes:>5} pods, {what}: {done} in {got[0]:.0f} s, peak {got[1]:.0f} MiB",
                        flush=True,
                    )
        nodes = max(args.nodes)
        ns = f"tpl-budget-{nodes}"
        op.start_in(ns, state / "restart.log")
        try:
            _, peak = sampled(op, lambda: phase(op, ns, "heavy") != "", 30)
            print(f"restart with {nodes:,} budget-template pods in place: peak {peak:.0f} MiB")
        finally:
            op.stop()
    finally:
        op.stop()
        if started:
            subprocess.run(
                [str(cap.DRIVER), "down", "--state", str(state)], check=False, capture_output=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
