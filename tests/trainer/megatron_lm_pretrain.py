"""`python tests/trainer/megatron_lm_pretrain.py ARGS...`: Megatron-LM's own pretrain_gpt.py
(from MEGATRON_LM_SRC), unchanged, as one rank on CPU: the CPU shim of megatron_lm.py (the
same one the interchange tests use) is installed, then pretrain_gpt.py runs as `__main__` with
ARGS as its own command line. A trainer.command in tests/local/test_megatron_lm_own_code.py.

Run from its path, as megatron_lm.py is (see there: a Megatron-LM checkout has its own `tests`).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Megatron-LM modules on the training path that call CUDA directly, beside the shim's own list.
TRAINING_MODULES = ("megatron.training.utils", "megatron.training.training")


def main() -> None:
    root = os.environ["MEGATRON_LM_SRC"]
    sys.path.insert(0, str(HERE))
    import megatron_lm  # the CPU shim (tests/trainer/megatron_lm.py)

    sys.path.remove(str(HERE))
    sys.path.append(root)  # after site-packages: megatron.core stays the installed 0.16.1
    megatron_lm._with_six()
    megatron_lm._install_cpu_shims()
    megatron_lm._wrap_load()
    import importlib

    # pretrain() asserts CUDA (initialize_megatron without allow_no_cuda): the shim's stand-in
    # says yes there, and only there.
    initialize = importlib.import_module("megatron.training.initialize")
    initialize.torch.cuda.is_available = lambda: True
    # The warm-up of the fused bias-GeLU/dropout JIT kernels runs CUDA tensors (unused here).
    training = importlib.import_module("megatron.training.training")
    training.set_jit_fusion_options = lambda *args, **kwargs: None
    # get_batch moves each batch to the GPU (`tensor.cuda(non_blocking=True)`): it stays here.
    import torch

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    script = str(Path(root) / "pretrain_gpt.py")
    sys.argv = [script, *sys.argv[1:]]
    sys.path.insert(0, root)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
