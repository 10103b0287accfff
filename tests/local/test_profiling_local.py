"""spec.profiling with VizTracer end to end on CPU: `mjob run --local` leaves one trace for each
listed rank and none for the others, and `mjob profiles` lists and copies it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_local_run import mjob

pytestmark = pytest.mark.trainer

SPEC = """apiVersion: megatron.dev/v1alpha1
kind: MegatronJob
metadata: {name: viz}
spec:
  image: trainer:local
  model: {recipe: gpt-tiny}
  parallelism: {tensor: 2}
  training: {globalBatchSize: 8, microBatchSize: 2, trainIters: 6, precision: fp32, warmupIters: 1}
  data: {mock: true}
  resources: {nodes: 1, procsPerNode: 2, accelerator: none}
  checkpoint: {volume: {claimName: c}, saveInterval: 6}
  profiling: {tool: viztracer, startStep: 3, endStep: 5, ranks: [0]}
"""


def test_viztracer_window_on_rank_0_only(tmp_path: Path) -> None:
    spec = tmp_path / "viz.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    workdir = tmp_path / "run"
    out = mjob("run", str(spec), "--local", "--workdir", str(workdir))
    assert out.returncode == 0, out.stderr[-3000:]
    profiles = workdir / "checkpoints" / "viz" / "profiles"
    assert sorted(str(p.relative_to(profiles)) for p in profiles.rglob("*") if p.is_file()) == [
        "0/rank0.viztracer.json"
    ]
    trace = json.loads((profiles / "0" / "rank0.viztracer.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    # Steps 3..5 of the training loop are inside the window: three train_step calls.
    steps = [
        e for e in trace["traceEvents"] if e.get("name", "").startswith("Trainer.train_step (")
    ]
    assert len(steps) == 3, sorted(n for n in names if "train_step" in n)

    listed = mjob("profiles", "viz", "--workdir", str(workdir), "--copy-to", str(tmp_path / "out"))
    assert listed.returncode == 0, listed.stderr
    assert "attempt 0  rank0.viztracer.json" in listed.stdout
    copied = tmp_path / "out" / "0" / "rank0.viztracer.json"
    assert copied.read_bytes() == (profiles / "0" / "rank0.viztracer.json").read_bytes()


def test_profiles_of_an_unknown_run_names_the_fix(tmp_path: Path) -> None:
    out = mjob("profiles", "nothing-here", "--workdir", str(tmp_path / "none"))
    assert out.returncode == 2
    assert "--checkpoint-dir" in out.stderr
