"""`mjob render` of a job at the node cap (4,096 pods): wall time and peak memory.

Two ways, each in a fresh process, in the same run:
- `mjob render` as shipped: objects rendered and written one at a time, libyaml's emitter;
- the peer: the whole `v1/List` rendered, then dumped at once with PyYAML's pure-Python emitter
  (how `mjob render` worked before; same text).

Run: python benchmarks/render_cap.py [--nodes 4096] [--repeat 3]. Prints the best of each.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

PEER = """
import sys, yaml
from megatron_operator.api import load_file
from megatron_operator.core.planner import plan
from megatron_operator.core.render import as_list, render
from megatron_operator.cli import yamlio

class PureDumper(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True

PureDumper.add_representer(str, yamlio._str)
job = load_file(sys.argv[1])
text = yaml.dump(as_list(render(job, plan(job.spec), 0)), Dumper=PureDumper, sort_keys=False,
                 allow_unicode=True, width=100)
sys.stdout.write(text)
"""


def spec_file(nodes: int, directory: Path) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "llama3-70b.yaml").read_text())
    doc["spec"]["resources"]["nodes"] = nodes
    doc["spec"]["training"]["globalBatchSize"] = 8 * nodes
    path = directory / "cap.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def measure(argv: list[str], out: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one run, in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    with out.open("wb") as f:
        subprocess.run(argv, stdout=f, check=True)
    took = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest of any child so far: run the small one first.
    return took, max(peak, before) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="render-cap-"))
    spec = spec_file(args.nodes, tmp)
    ours_argv = [sys.executable, "-m", "megatron_operator.cli.main", "render", str(spec)]
    peer_argv = [sys.executable, "-c", PEER, str(spec)]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}; {args.nodes} pods",
        flush=True,
    )
    ours = [measure(ours_argv, tmp / "ours.yaml") for _ in range(args.repeat)]
    same = (tmp / "ours.yaml").read_bytes()
    peer = [measure(peer_argv, tmp / "peer.yaml") for _ in range(args.repeat)]
    assert (tmp / "peer.yaml").read_bytes() == same, "the two ways must write the same text"
    best_ours, best_peer = min(t for t, _ in ours), min(t for t, _ in peer)
    rss_ours = min(m for _, m in ours)
    rss_peer = max(m for _, m in peer)
    print(f"mjob render (streamed, libyaml): {best_ours:.1f} s, peak RSS {rss_ours:.0f} MiB")
    print(f"peer (whole list, pure-Python emitter): {best_peer:.1f} s, peak RSS {rss_peer:.0f} MiB")
    print(f"ratio: {best_ours / best_peer:.2f} of the time; output {len(same) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
