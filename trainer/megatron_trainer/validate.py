"""The trainer's checks before any rank starts, so an impossible job exits 78 in milliseconds
instead of failing deep inside Megatron-Core after minutes of start-up.

The layout rules are the contract's (`megatron_contract.rules`), the same code the operator's
planner ran before the pods were scheduled; this module adds only what the trainer alone can
check: the environment it was started with, and the data paths on its volumes.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from megatron_contract.choices import CPU
from megatron_contract.config import LaunchConfig, TrainerConfig, is_msc_url
from megatron_contract.env import MSC_CONFIG, RuntimeEnv
from megatron_contract.errors import ConfigError
from megatron_contract.rules import check_config

from .decisions import fsdp_env_problems


def validate(
    config: TrainerConfig, env: RuntimeEnv | None = None, *, check_paths: bool = True
) -> None:
    """Raise ConfigError listing every problem; return None when the job can run.

    `check_paths=False` skips the checks of the pod's volumes and image: that data and
    tokenizer files exist, and that Transformer Engine is installed where the layout needs it
    (for checking a rendered config elsewhere, e.g. in the contract test).
    """
    problems = [str(p) for p in check_config(config)] + _fsdp_problems(config)
    if env is not None:
        problems += _env_problems(config, env)
    if check_paths:
        problems += _path_problems(config)
        if config.resources.accelerator != CPU:
            problems += te_problems(config, te_installed())
    if problems:
        raise ConfigError(problems)


def validate_launch(config: LaunchConfig, env: RuntimeEnv) -> None:
    """A trainer.command's config: the layout rules over the sections it has, and the env. The
    paths are the command's business (it may read data its own way)."""
    problems = [str(p) for p in check_config(config)] + _env_problems(config, env)
    if problems:
        raise ConfigError(problems)


def _fsdp_problems(config: TrainerConfig) -> list[str]:
    """What Megatron FSDP's checkpoints (fsdp_dtensor) cannot do; the planner and the CRD refuse
    the same specs."""
    if not config.parallelism.fsdp:
        return []
    problems = []
    init = config.checkpoint.init
    if init is not None and init.megatron is not None and init.megatron.load == "full":
        problems.append(
            "checkpoint.init.megatron.load: load: full reads a torch_dist checkpoint's optimizer "
            "state, which Megatron FSDP (fsdp_dtensor) cannot take: use load: weights"
        )
    if is_msc_url(config.checkpoint.dir):
        problems.append(
            f"checkpoint.dir: {config.checkpoint.dir}: Megatron FSDP saves fsdp_dtensor "
            "checkpoints with torch DCP's file-system writer: use a checkpoint volume"
        )
    return problems


def te_installed() -> bool:
    """Whether Transformer Engine is installed, without importing it (no torch, no CUDA in the
    launcher). A build that is installed but does not import is found by the rank
    (model.use_transformer_engine), with the same messages."""
    return importlib.util.find_spec("transformer_engine") is not None


def te_problems(config: TrainerConfig, te: bool) -> list[str]:
    """What a CUDA job asks for that needs Transformer Engine, when `te` is False."""
    if te:
        return []
    p, problems = config.parallelism, []
    if config.training.precision == "fp8":
        problems.append(
            "training.precision: fp8 needs Transformer Engine, which this image lacks: use a "
            "trainer image with Transformer Engine, or bf16"
        )
    if p.sequence_parallel:
        way_out = (
            "an MoE model with tensor > 1 needs it, so use tensor: 1"
            if config.model.moe is not None
            else "set parallelism.sequenceParallel: false to run without it (more activation "
            "memory a GPU)"
        )
        problems.append(
            "parallelism.sequenceParallel needs Transformer Engine (Megatron-Core's torch norms "
            "do not support it), which this image lacks. Sequence parallelism is on by default "
            f"with tensor > 1 on GPUs: {way_out}, or use a trainer image with Transformer Engine"
        )
    if p.context > 1:
        problems.append(
            "parallelism.context: context parallelism needs Transformer Engine attention "
            "(Megatron-Core's local attention supports context: 1 only), which this image "
            "lacks: use a trainer image with Transformer Engine, or context: 1"
        )
    return problems


def _env_problems(config: TrainerConfig | LaunchConfig, env: RuntimeEnv) -> list[str]:
    res, problems = config.resources, []
    if env.nnodes != res.nodes:
        problems.append(f"NNODES ({env.nnodes}) differs from resources.nodes ({res.nodes})")
    if env.nproc_per_node != res.procs_per_node:
        problems.append(
            f"NPROC_PER_NODE ({env.nproc_per_node}) differs from resources.procsPerNode "
            f"({res.procs_per_node})"
        )
    if env.world_size != config.world_size:
        problems.append(
            f"WORLD_SIZE ({env.world_size}) differs from resources.nodes × procsPerNode "
            f"({config.world_size})"
        )
    return problems + fsdp_env_problems(config.parallelism.fsdp, dict(os.environ))


def _path_problems(config: TrainerConfig) -> list[str]:
    d, problems = config.data, []
    for i, entry in enumerate(d.blend or ()):
        for suffix in (".bin", ".idx"):
            if not os.path.isfile(entry.prefix + suffix):
                problems.append(
                    f"data.blend[{i}].prefix: {entry.prefix + suffix} does not exist; run "
                    "`mjob preprocess` to create it, or fix the prefix (without .bin/.idx)"
                )
    init = config.checkpoint.init
    if init is not None and init.hugging_face is not None:
        from .hf import check_hf_config  # pure: reads config.json, no torch

        problems += check_hf_config(config.model, init.hugging_face.path)
    msc_paths = [config.checkpoint.dir]
    if init is not None and init.megatron is not None:
        msc_paths.append(init.megatron.path)
    problems += _msc_problems([p for p in msc_paths if is_msc_url(p)])
    if (
        init is not None
        and init.megatron is not None
        and not is_msc_url(init.megatron.path)
        and not os.path.isdir(init.megatron.path)
    ):
        problems.append(
            f"checkpoint.init.megatron.path: {init.megatron.path} is not a directory; mount the "
            "checkpoint to start from on a volume of the job"
        )
    if d.tokenizer_path is not None and not (Path(d.tokenizer_path) / "tokenizer.json").is_file():
        problems.append(
            f"data.tokenizer.path: {d.tokenizer_path}/tokenizer.json does not exist; point it at "
            "a directory holding a Hugging Face tokenizer.json"
        )
    return problems


def _msc_problems(urls: list[str]) -> list[str]:
    """msc:// paths need multi-storage-client and its config (MSC_CONFIG names the file)."""
    if not urls:
        return []
    try:
        import multistorageclient  # noqa: F401 - only checking that it is installed
    except ImportError:
        return [
            f"checkpoint.dir: {urls[0]} needs multi-storage-client, which this image lacks: "
            "install the trainer extra (pip install -e '.[trainer]' from a checkout of this repository)"
        ]
    config = os.environ.get(MSC_CONFIG)
    if not config or not os.path.isfile(config):
        where = f"{MSC_CONFIG}={config}" if config else f"{MSC_CONFIG} is unset"
        return [
            f"checkpoint.dir: {urls[0]} needs the MSC config file ({where}); in a cluster it "
            "comes from checkpoint.msc.configSecret, with mjob run --local export MSC_CONFIG"
        ]
    profiles = {u[len("msc://") :].split("/", 1)[0] for u in urls}
    text = Path(config).read_text(encoding="utf-8", errors="replace")
    missing = sorted(p for p in profiles if p not in text)
    if missing:
        return [
            f"checkpoint.dir: the MSC config {config} has no profile {missing[0]!r}; add it "
            "under profiles: or fix the URL (msc://PROFILE/PATH)"
        ]
    return []
