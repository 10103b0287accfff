"""The resolved trainer configuration (docs/contract.md §2), built from a job and its plan (pure).

The plan already holds the contract's sections (model, parallelism, training, data, resources,
profiling), resolved and checked; this adds the job's identity and its checkpoint plumbing. The
trainer never re-derives a default, so both sides agree by construction.
"""

from __future__ import annotations

from megatron_contract import paths
from megatron_contract.config import (
    CheckpointConfig,
    CommandConfig,
    HuggingFaceInit,
    InitConfig,
    JobInfo,
    LaunchConfig,
    MegatronInit,
    MemoryConfig,
    ProgressConfig,
    TrainerConfig,
)
from megatron_operator.api.job import MegatronJob
from megatron_operator.core import tiers
from megatron_operator.core.planner import Plan


def checkpoint_dir(job: MegatronJob) -> str:
    """The volume's directory in the pod, or the checkpoint.url itself (object storage)."""
    c = job.spec.checkpoint
    if c.url is not None:
        return c.url
    return paths.checkpoint_dir(c.path or job.name)


def _init(job: MegatronJob) -> InitConfig | None:
    init = job.spec.checkpoint.init
    if init is None:
        return None
    m, hf = init.megatron, init.hugging_face
    return InitConfig(
        megatron=MegatronInit(m.path, m.load) if m else None,
        hugging_face=HuggingFaceInit(hf.path) if hf else None,
    )


def restart_strategy(job: MegatronJob) -> str:
    """How the pods' launchers handle a failed rank (core/tiers.py, `strategy`)."""
    return tiers.strategy(job.spec)


def memory_config(job: MegatronJob, plan: Plan) -> MemoryConfig | None:
    """The in-memory tiers, where a pod can outlive its ranks (restart strategy InPlace): a
    recreated pod keeps no memory, so without it they would hold memory for nothing."""
    if not tiers.enabled(job.spec):
        return None
    interval = job.spec.checkpoint.memory.interval
    return MemoryConfig(paths.MEMORY_MOUNT, interval, tiers.replicated(job.spec))


def trainer_config(job: MegatronJob, plan: Plan) -> TrainerConfig | LaunchConfig:
    """The built-in trainer's config, or with spec.trainer the command's (sections the spec
    does not give are null). Fields in TrainerConfig's order."""
    c, t = job.spec.checkpoint, job.spec.trainer
    info = JobInfo(job.name, job.namespace, job.metadata.uid)
    checkpoint = CheckpointConfig(
        dir=checkpoint_dir(job),
        save_interval=c.save_interval,
        async_save=c.async_,
        keep=c.keep,
        sharding_type=c.sharding_type,
        load=True,
        init=_init(job),
        memory=memory_config(job, plan),
    )
    progress = ProgressConfig(paths.PROGRESS_ANNOTATION, paths.PROGRESS_MIN_INTERVAL_SECONDS)
    parallelism = plan.degrees.config()
    m, tr, d = plan.model, plan.training, plan.data
    if t is None and m is not None and tr is not None and d is not None:
        return TrainerConfig(
            info, m, parallelism, tr, d, checkpoint, plan.resources, progress, plan.profiling, None
        )
    command = CommandConfig(tuple(t.command), tuple(t.args), t.progress) if t is not None else None
    return LaunchConfig(
        info, m, parallelism, tr, d, checkpoint, plan.resources, progress, plan.profiling, command
    )
