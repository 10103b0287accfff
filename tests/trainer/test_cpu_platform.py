"""The CPU platform's Megatron-Core patches (megatron_trainer/platform/cpu.py) are needed and
sufficient.

Sufficient: a run that touches every patched path (MoE with expert parallelism 2, PP=2 with
interleaving, DP=2, async torch_dist saves in the fully_reshardable format, SIGTERM, and a resume
onto a different pipeline layout) trains and resumes on CPU.
Needed: every patch was used by that run (each use is a CUDA call that raises on a machine without
a GPU, shown here for each module's stand-in), and the pin to Megatron-Core 0.16.1 holds.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from megatron_trainer.platform import cpu

from .trainer_configs import TINY_MOE, tiny_config
from .trainer_runs import run_trainer

pytestmark = pytest.mark.trainer


def moe_config(ckpt: Path, pp: int, vpp: int | None) -> dict[str, object]:
    """MoE with expert parallelism 2 on 4 ranks."""
    cfg = tiny_config(
        ckpt, pp=pp, dp=4 // pp, vpp=vpp, trainIters=6, warmupIters=1, save_interval=3
    )
    cfg["model"]["moe"] = TINY_MOE
    cfg["parallelism"].update(expert=2, expertData=4 // pp // 2)
    cfg["checkpoint"].update(shardingType="fully_reshardable", **{"async": True})
    return cfg


def hits_by_site(directory: Path) -> Counter[str]:
    """Patch uses of every process of the runs (rank processes and their helpers)."""
    total: Counter[str] = Counter()
    for report in directory.glob("cpu-patch-hits-*.json"):
        for key, count in json.loads(report.read_text()).items():
            total[key.split(":")[0]] += count
    return total


def test_patches_are_sufficient_and_each_one_is_used(workdir: Path) -> None:
    assert not torch.cuda.is_available(), "this test shows what happens without a GPU"
    ckpt = workdir / "ckpt"
    # SIGTERM (not SIGKILL) so that every rank exits normally and reports its patch uses.
    stopped = run_trainer(
        moe_config(ckpt, pp=2, vpp=2),
        workdir,
        extra_env={"MEGATRON_INJECT_FAILURE": "5:0:TERM"},
        name="pp2",
    )
    assert stopped.returncode == 143, stopped.output[-4000:]
    assert "checkpoint 3: async save started" in stopped.output
    assert "checkpoint 3 complete" in stopped.output

    # Resume the fully_reshardable checkpoint of iteration 5 onto PP=1 × DP=4.
    resumed = run_trainer(moe_config(ckpt, pp=1, vpp=None), workdir, name="pp1")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert "RESUME: loading checkpoint iteration 5" in resumed.output
    assert sorted(resumed.losses()) == [6]
    assert resumed.losses()[6] < stopped.losses()[1] - 0.05  # it continued, not restarted

    used = hits_by_site(workdir)
    sites = list(cpu.PATCHED_MODULES) + [f"{m}.{path}" for m, path in cpu.TYPE_NAME_PATCHES]
    unused = [site for site in sites if used[site] == 0]
    assert unused == [], f"patches no run needed (remove them, or extend this run): {unused}"


@pytest.mark.parametrize("module", sorted(cpu.PATCHED_MODULES))
def test_each_stand_in_replaces_a_cuda_call_that_fails_here(module: str) -> None:
    import importlib

    cpu.install()
    stand_in = importlib.import_module(module).torch
    assert isinstance(stand_in, cpu._TorchOnCpu)
    assert stand_in.cuda.current_device() == torch.device("cpu")
    assert stand_in.zeros(2, device="cuda").device.type == "cpu"
    # What the module would do without its stand-in:
    with pytest.raises((RuntimeError, AssertionError), match=r"NVIDIA driver|CUDA"):
        torch.zeros(2, device="cuda")
    with pytest.raises((RuntimeError, AssertionError), match=r"NVIDIA driver|CUDA"):
        torch.cuda.current_device()


def test_cpu_tensors_pass_megatron_type_checks_only_inside_the_patched_functions() -> None:
    cpu.install()
    assert torch.zeros(1).type() == "torch.FloatTensor"  # torch itself is untouched
    seen: list[str] = []
    wrapped = cpu._with_cuda_type_names("test", lambda: seen.append(torch.zeros(1).type()))
    wrapped()
    assert seen == ["torch.cuda.FloatTensor"]
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_patches_are_pinned_to_the_megatron_core_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import package_info

    cpu.check_version()
    monkeypatch.setattr(package_info, "__version__", "0.17.0")
    with pytest.raises(RuntimeError, match=r"pinned to megatron-core==0\.16\.1, but 0\.17\.0"):
        cpu.check_version()
