"""The allowed values of every enumerated field, shared by the API models and the trainer's parser."""

from __future__ import annotations

from typing import Final

NORMALIZATIONS: Final = ("RMSNorm", "LayerNorm")
ACTIVATIONS: Final = ("swiglu", "gelu", "squared_relu")
POSITION_EMBEDDINGS: Final = ("rope", "learned_absolute")
PRECISIONS: Final = ("bf16", "fp16", "fp32", "fp8")
RECOMPUTE: Final = ("none", "selective", "full")
LR_DECAY_STYLES: Final = ("cosine", "linear", "constant", "inverse-square-root")
TOKEN_DISPATCHERS: Final = ("alltoall", "allgather")
SHARDING_TYPES: Final = ("dp_reshardable", "fully_reshardable")
CPU: Final = "none"  # resources.accelerator for CPU training (gloo)
ACCELERATORS: Final = ("nvidia.com/gpu", CPU)
INIT_LOADS: Final = ("weights", "full")  # checkpoint.init.megatron.load
# profiling.tool: torch.profiler, NVIDIA Nsight Systems around the rank process, VizTracer.
PROFILERS: Final = ("torch", "nsys", "viztracer")
NSYS: Final = "nsys"
# checkpoint.url: multi-storage-client (MSC) URLs, msc://PROFILE/PATH, as Megatron-Core reads them.
MSC_SCHEME: Final = "msc://"
