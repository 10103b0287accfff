"""Pipeline stages start from different weights on GPU (issue 12, item 8).

On GPU, Megatron-Core draws a TP-sharded weight inside the model-parallel RNG tracker
(`_initialize_affine_weight_gpu`) and a replicated one (norms, biases) from the default generator.
Both are seeded per rank; with one seed on every stage, every stage's layers started identical.
This runs Megatron-Core's GPU initialiser on CPU tensors (the CPU platform's tracker is the CPU
generator) after the trainer's own seeding, once per stage rank, in a one-rank gloo process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from megatron_contract.ports import free_port

pytestmark = pytest.mark.trainer

SCRIPT = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch
from megatron_trainer.platform import cpu
cpu.install()
torch.distributed.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1
)
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import _initialize_affine_weight_gpu
from megatron.core.utils import init_method_normal
from megatron_trainer.decisions import rank_seed
from megatron_trainer.loop import _seed_everything

parallel_state.initialize_model_parallel(1, 1)
draws = {}
for label, seed in [("stage0", rank_seed(1234, 0)), ("stage1", rank_seed(1234, 1)),
                    ("same-seed", 1234)]:
    _seed_everything(seed)  # what Trainer.__init__ does before building its stage
    sharded = torch.empty(8, 4)
    _initialize_affine_weight_gpu(sharded, init_method_normal(0.02), partition_dim=0)
    replicated = torch.empty(4)
    torch.nn.init.normal_(replicated)
    draws[label] = [sharded.flatten().tolist(), replicated.tolist()]
print(json.dumps(draws))
torch.distributed.destroy_process_group()
"""


def test_gpu_initialisation_differs_between_pipeline_stages() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(free_port())],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    draws = json.loads(proc.stdout.strip().splitlines()[-1])
    stage0_sharded, stage0_replicated = draws["stage0"]
    stage1_sharded, stage1_replicated = draws["stage1"]
    assert stage0_sharded != stage1_sharded
    assert stage0_replicated != stage1_replicated
    # Stage 0 keeps the job's seed; one seed for every stage would give stage 1 these weights.
    assert draws["same-seed"] == draws["stage0"]
