"""The CUDA platform: one GPU per local rank, NCCL, Transformer Engine when it imports."""

from __future__ import annotations

import functools

import torch

# Dense (no sparsity) bf16/fp16 peak TFLOP/s per GPU from NVIDIA's datasheets, for MFU: half the
# "with sparsity" figure. The PCIe and NVL parts run at lower clocks/power than SXM and have their
# own peaks. Matched against torch.cuda.get_device_name(), longest key first, so "H100 PCIe" wins
# over "H100" (the SXM part reports "NVIDIA H100 80GB HBM3"). Unknown devices report mfu = null
# rather than a guess.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,  # SXM
    "H200 NVL": 835.0,
    "H200": 989.0,  # SXM
    "GH200": 989.0,
    "H800 PCIe": 756.0,
    "H800": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "B200": 2250.0,
    "L40S": 362.0,
}


def setup(local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError(
            "resources.accelerator asks for GPUs but torch sees no CUDA device in this container; "
            "check the node's driver and the pod's GPU request"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError(
            f"local rank {local_rank} has no GPU: this pod sees {count} CUDA device(s); "
            "resources.procsPerNode must not exceed the GPUs per pod"
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@functools.cache
def transformer_engine_available() -> bool:
    """TE is optional: the TE layer spec when it imports, else the local spec with SDPA."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # ImportError, or a TE build that does not match this torch/CUDA
        return False
    return True


def peak_tflops(precision: str) -> float | None:
    """Peak dense TFLOP/s of this GPU for `precision`, or None when unknown."""
    if precision not in ("bf16", "fp16", "fp8") or not torch.cuda.is_available():
        return None
    # MFU is quoted against the bf16 peak even for fp8, as Megatron-LM does.
    return peak_for_device(torch.cuda.get_device_name())


def peak_for_device(name: str) -> float | None:
    """The dense bf16 peak of the GPU called `name` (as CUDA reports it), or None."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_TFLOPS[key]
    return None


@functools.cache
def apex_grad_accum_available() -> bool:
    """Apex's `fused_weight_gradient_mlp_cuda` extension, which Megatron's own linear layers
    need for gradient_accumulation_fusion (choices.gradient_accumulation_fusion)."""
    import importlib.util

    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None
