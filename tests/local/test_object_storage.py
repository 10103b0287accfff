"""Checkpoints on object storage (checkpoint.url: msc://...) end to end, against a real S3 server
on loopback (moto's standalone server, tests/s3server.py): save, resume after a kill, keep, the
tracker written last, TensorBoard and profiles in the bucket, export and init from the bucket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.s3server import S3Server

from .test_local_run import ROOT, check_tiers, mjob

pytestmark = pytest.mark.trainer

URL = "msc://ckpt/jobs/tiny"
ITERS, SAVE, KILL = 12, 4, "6:1"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


def _spec(
    tmp: Path, name: str, checkpoint: dict[str, Any], extra: str = "", file: str = ""
) -> Path:
    text = f"""apiVersion: megatron.dev/v1alpha1
kind: MegatronJob
metadata: {{name: {name}}}
spec:
  image: trainer:local
  model: {{recipe: gpt-tiny}}
  parallelism: {{tensor: 2}}
  training: {{globalBatchSize: 8, microBatchSize: 2, trainIters: {ITERS}, precision: fp32,
             warmupIters: 1, lr: 0.001, minLr: 0.0001}}
  data: {{mock: true}}
  resources: {{nodes: 1, procsPerNode: 2, accelerator: none}}
  checkpoint: {json.dumps({**checkpoint, "saveInterval": SAVE})}
  restartPolicy: {{backoffSeconds: 1}}
{extra}"""
    path = tmp / f"{file or name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _run(spec: Path, workdir: Path, env: dict[str, str], *extra: str) -> dict[str, Any]:
    out = mjob("run", str(spec), "--local", "--workdir", str(workdir), *extra, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary: dict[str, Any] = json.loads((workdir / "summary.json").read_text())
    return summary


@pytest.fixture(scope="module")
def runs(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The same job, killed once at step 6, with checkpoints in a directory and in the bucket."""
    tmp = tmp_path_factory.mktemp("runs")
    on_disk = _spec(tmp, "tiny", {"volume": {"claimName": "c"}, "keep": 2}, file="on-disk")
    in_bucket = _spec(
        tmp, "tiny", {"url": URL, "msc": {"configSecret": "msc-config"}, "keep": 2},
        "  profiling: {tool: viztracer, startStep: 9, endStep: 10, ranks: [1]}\n", "in-bucket",
    )  # fmt: skip
    return {
        "directory": _run(on_disk, tmp / "dir", s3.env(), "--inject-failure", KILL),
        "bucket": _run(in_bucket, tmp / "msc", s3.env(), "--inject-failure", KILL),
    }


def test_killed_job_on_object_storage_matches_the_directory_job_bit_for_bit(
    runs: dict[str, dict[str, Any]],
) -> None:
    disk, bucket = runs["directory"], runs["bucket"]
    assert disk["checkpointDir"].endswith("/checkpoints/tiny")  # a directory ...
    assert bucket["checkpointDir"] == URL  # ... and the bucket
    assert disk["restarts"] == bucket["restarts"] == 1
    assert len(bucket["losses"]) == ITERS
    assert bucket["losses"] == disk["losses"]  # floats from JSON: bit for bit
    assert bucket["checkpoints"] == disk["checkpoints"] == [8, 12]  # keep: 2
    # Killed at step 6, past the save of step 4: both resumed from the snapshot in memory.
    for run in (disk, bucket):
        check_tiers(Path(run["workdir"]), ["Memory"])


def test_the_bucket_holds_the_checkpoints_and_the_tracker(
    runs: dict[str, dict[str, Any]], s3: S3Server
) -> None:
    keys = s3.keys("jobs/tiny/")
    iters = sorted({k.split("/")[2] for k in keys if k.split("/")[2].startswith("iter_")})
    assert iters == ["iter_0000008", "iter_0000012"]  # 4 pruned after 8 was complete
    for it in iters:
        names = {k.split("/", 3)[3] for k in keys if k.split("/")[2] == it}
        assert {"metadata.json", ".metadata", "common.pt"} <= names
        assert any(n.endswith(".distcp") for n in names)
    assert s3.read("jobs/tiny/latest_checkpointed_iteration.txt").strip() == b"12"
    assert any(k.startswith("jobs/tiny/tensorboard/events.out.tfevents") for k in keys)
    # The profiler window ran in attempt 1 (after the kill), on rank 1 only.
    assert [k for k in keys if "/profiles/" in k] == ["jobs/tiny/profiles/1/rank1.viztracer.json"]
    assert json.loads(s3.read("jobs/tiny/profiles/1/rank1.viztracer.json"))["traceEvents"]


def test_export_hf_reads_the_bucket(
    runs: dict[str, dict[str, Any]], s3: S3Server, tmp_path: Path
) -> None:
    out = mjob("export", "--hf", URL, "--output", str(tmp_path / "hf"), env=s3.env())
    assert out.returncode == 0, out.stderr[-3000:]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == 4
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size > 0


def test_init_from_a_megatron_checkpoint_in_the_bucket(
    runs: dict[str, dict[str, Any]], s3: S3Server, tmp_path: Path
) -> None:
    spec = _spec(
        tmp_path,
        "from-bucket",
        {"volume": {"claimName": "c"}, "init": {"megatron": {"path": URL, "load": "full"}}},
    )
    summary = _run(spec, tmp_path / "w", s3.env())
    # load: full continues at iteration 13 of 12: nothing left to train, nothing to redo.
    assert summary["status"] == "Succeeded"


def test_a_local_run_without_msc_config_is_refused_naming_the_variable(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "no-config", {"url": URL, "msc": {"configSecret": "m"}})
    env = {k: v for k, v in __import__("os").environ.items() if k != "MSC_CONFIG"}
    out = mjob("run", str(spec), "--local", "--workdir", str(tmp_path / "w"), env=env)
    assert out.returncode == 2
    assert "spec.checkpoint.url" in out.stderr and "MSC_CONFIG" in out.stderr
    assert not (ROOT / "runs" / "no-config").exists()


def test_async_save_to_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    """checkpoint.async: the shards are written by Megatron-Core's background writer (the
    fork-per-save caller on CPU) through MSC; the tracker still comes last."""
    url = "msc://ckpt/jobs/async"
    spec = _spec(
        tmp_path, "async-job", {"url": url, "msc": {"configSecret": "m"}, "async": True, "keep": 0}
    )
    summary = _run(spec, tmp_path / "w", s3.env(), "--set", "training.trainIters=8")
    assert summary["checkpoints"] == [4, 8]
    keys = s3.keys("jobs/async/")
    assert (
        "jobs/async/iter_0000004/.metadata" in keys and "jobs/async/iter_0000008/.metadata" in keys
    )
    assert s3.read("jobs/async/latest_checkpointed_iteration.txt").strip() == b"8"
    log = next((tmp_path / "w" / "logs" / "attempt-0").glob("*.log")).read_text()
    assert "checkpoint 4: async save started" in log
