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
# RoPE scaling the spec can name; the layout rules refuse yarn (not implemented) by name.
ROPE_SCALING_TYPES: Final = ("llama3", "yarn")
SHARDING_TYPES: Final = ("dp_reshardable", "fully_reshardable")
# trainer.progress: where the launchers read a trainer.command's progress. MegatronLog: the
# ranks' output (Megatron-LM's and Bridge's `iteration N/ M | ... | lm loss: X |` lines) and the
# progress file; File: the progress file only; None: no source (no hang rule, no alert).
PROGRESS_MEGATRON_LOG: Final = "MegatronLog"
PROGRESS_FILE: Final = "File"
PROGRESS_NONE: Final = "None"
PROGRESS_SOURCES: Final = (PROGRESS_MEGATRON_LOG, PROGRESS_FILE, PROGRESS_NONE)
CPU: Final = "none"  # resources.accelerator for CPU training (gloo)
ACCELERATORS: Final = ("nvidia.com/gpu", CPU)
INIT_LOADS: Final = ("weights", "full")  # checkpoint.init.megatron.load
# profiling.tool: torch.profiler, NVIDIA Nsight Systems around the rank process, VizTracer.
PROFILERS: Final = ("torch", "nsys", "viztracer")
NSYS: Final = "nsys"
# checkpoint.url: multi-storage-client (MSC) URLs, msc://PROFILE/PATH, as Megatron-Core reads them.
MSC_SCHEME: Final = "msc://"
