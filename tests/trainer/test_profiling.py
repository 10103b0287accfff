"""Profiling: the plugin interface, and nsys exactly as Megatron Bridge runs it (the launcher starts
exactly the listed ranks under `nsys profile --capture-range=cudaProfilerApi`). nsys itself needs a
GPU and NVIDIA's tools, which this machine lacks: the command line is checked exactly, and a
stand-in `nsys` on PATH shows the launcher runs it for those ranks and no others."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from megatron_contract.config import parse_config
from megatron_contract.env import runtime_env
from megatron_trainer import profilers
from megatron_trainer.launcher import NsysCaptures, Supervisor
from megatron_trainer.profilers import nsys

from .trainer_configs import tiny_config

pytestmark = pytest.mark.trainer

RANK_COMMAND = ["python", "-m", "megatron_trainer.worker"]


def _config(ckpt: str, tool: str, ranks: list[int], world: int = 4) -> object:
    cfg = tiny_config(ckpt, dp=world)
    cfg["resources"]["accelerator"] = "nvidia.com/gpu"
    cfg["training"]["precision"] = "bf16"
    cfg["profiling"] = {"tool": tool, "startStep": 3, "endStep": 5, "ranks": ranks}
    return parse_config(cfg)


def test_nsys_command_is_megatron_bridges() -> None:
    assert nsys.command("/ckpt/profiles/0/rank1", RANK_COMMAND) == [
        "nsys", "profile", "-s", "none", "-t", "nvtx,cuda",
        "-o", "/ckpt/profiles/0/rank1",
        "--force-overwrite", "true",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "python", "-m", "megatron_trainer.worker",
    ]  # fmt: skip


def test_only_the_listed_ranks_run_under_nsys(tmp_path: Path) -> None:
    captures = NsysCaptures(_config(str(tmp_path / "ckpt"), "nsys", [1, 3]), attempt=2)  # type: ignore[arg-type]
    wrapped = {rank: captures.wrap(rank, RANK_COMMAND) for rank in range(4)}
    assert wrapped[0] == wrapped[2] == RANK_COMMAND
    for rank in (1, 3):
        out = str(tmp_path / "ckpt" / "profiles" / "2" / f"rank{rank}")
        assert wrapped[rank] == nsys.command(out, RANK_COMMAND)
    assert (tmp_path / "ckpt" / "profiles" / "2").is_dir()  # nsys does not create it


def test_other_tools_wrap_nothing(tmp_path: Path) -> None:
    for tool in ("torch", "viztracer"):
        captures = NsysCaptures(_config(str(tmp_path), tool, [0]), attempt=0)  # type: ignore[arg-type]
        assert captures.wrap(0, RANK_COMMAND) == RANK_COMMAND


def test_nsys_on_object_storage_writes_to_scratch_and_uploads_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEGATRON_SCRATCH", str(tmp_path / "scratch"))
    captures = NsysCaptures(_config("msc://ckpt/jobs/a", "nsys", [0]), attempt=1)  # type: ignore[arg-type]
    command = captures.wrap(0, RANK_COMMAND)
    assert command[command.index("-o") + 1] == str(tmp_path / "scratch" / "profiles" / "rank0")
    assert captures.reports == {
        str(tmp_path / "scratch" / "profiles" / "rank0.nsys-rep"): (
            "msc://ckpt/jobs/a/profiles/1/rank0.nsys-rep"
        )
    }


def test_the_launcher_starts_listed_ranks_under_nsys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in nsys on PATH records its arguments, then runs the rank's command as nsys
    would; each rank records that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "cut = args.index('--capture-range-end=stop') + 1\n"
        f"open(os.path.join({str(tmp_path)!r}, 'nsys-' + os.environ['RANK']), 'w')"
        ".write(json.dumps(args[:cut]))\n"
        "os.execvp(args[cut], args[cut:])\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env = runtime_env(
        {
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "WORLD_SIZE": "4",
            "NNODES": "2", "NODE_RANK": "1", "NPROC_PER_NODE": "2",
            "MEGATRON_CONFIG": "/unused", "MEGATRON_RESTART_ATTEMPT": "0",
        }
    )  # fmt: skip
    captures = NsysCaptures(_config(str(tmp_path / "ckpt"), "nsys", [3]), attempt=0)  # type: ignore[arg-type]
    rank_cmd = [
        sys.executable, "-c",
        f"import os; open(os.path.join({str(tmp_path)!r}, 'ran-' + os.environ['RANK']), 'w')",
    ]  # fmt: skip
    supervisor = Supervisor(env, True, rank_cmd, wrap=captures.wrap)
    supervisor.start()
    assert supervisor.wait() == 0
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-2", "ran-3"]  # node 1's ranks
    assert [p.name for p in tmp_path.glob("nsys-*")] == ["nsys-3"]
    recorded = json.loads((tmp_path / "nsys-3").read_text())
    assert recorded == nsys.command(str(tmp_path / "ckpt" / "profiles" / "0" / "rank3"), [])[1:]


def test_a_profiler_is_one_module_with_start_stop_save() -> None:
    from megatron_contract.choices import PROFILERS

    assert sorted(profilers.PLUGINS) == sorted(PROFILERS)  # what the API offers, each a plugin
    for tool in profilers.PLUGINS:
        plugin = profilers.load(tool, cuda=False)
        assert callable(plugin.start) and callable(plugin.stop) and callable(plugin.save)
        assert plugin.suffix
    assert profilers.capture_name(7, "viztracer.json") == "rank7.viztracer.json"


def test_nsys_range_carries_per_op_nvtx_ranges_as_megatron_lm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without emit_nvtx, `-t nvtx` records no per-op ranges. The CUDA calls are recorded
    stand-ins here (no GPU): the order and the arguments are Megatron-LM's (training.py)."""
    import torch

    calls: list[str] = []

    class CudaRuntime:
        def cudaProfilerStart(self) -> None:
            calls.append("cudaProfilerStart")

        def cudaProfilerStop(self) -> None:
            calls.append("cudaProfilerStop")

    class EmitNvtx:
        def __init__(self, **kwargs: object) -> None:
            calls.append(f"emit_nvtx({kwargs})")

        def __enter__(self) -> None:
            calls.append("enter")

        def __exit__(self, *exc: object) -> None:
            calls.append("exit")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "cudart", CudaRuntime)
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", EmitNvtx)
    plugin = nsys.Plugin(cuda=True)
    plugin.start()
    plugin.stop()
    assert calls == [
        "cudaProfilerStart",
        "emit_nvtx({'record_shapes': True})",
        "enter",
        "cudaProfilerStop",
        "exit",
    ]
