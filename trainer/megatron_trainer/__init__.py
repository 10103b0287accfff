"""The MegatronJob trainer: a Megatron-Core training loop (CUDA/NCCL and CPU/gloo)."""
