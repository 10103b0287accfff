"""The training loop of one rank: set up Megatron-Core, resume, train, checkpoint, report."""

from __future__ import annotations

import logging
import random
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import finalize_model_grads
from megatron.core.num_microbatches_calculator import (
    destroy_num_microbatches_calculator,
    init_num_microbatches_calculator,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_contract import tiers
from megatron_contract.config import InitConfig, TrainerConfig
from megatron_contract.env import RuntimeEnv
from megatron_contract.errors import ConfigError
from megatron_contract.exitcodes import ExitCode
from megatron_contract.timeline import Clock

from .async_save import prefork as prefork_save_helpers
from .checkpoint import Checkpointer, iteration_path, load_common, model_fingerprint
from .data import MicroBatches, build_dataset
from .decisions import (
    ddp_bucket_size,
    ddp_buckets,
    needs_param_broadcast,
    rank_seed,
    recorded_bucket_size,
)
from .flops import flops_per_step, tflops_per_gpu
from .model import build_model, transformer_config
from .numerics import (
    NonFiniteLoss,
    check_grad_norm,
    check_loss,
    is_non_finite_grad_error,
    nan_injection_iteration,
)
from .platform import Platform, setup_platform
from .progress import LeaseWriter, ProgressReporter, Report
from .signals import StopFlag, inject_failures
from .snapshots import Found, Snapshots, check_record
from .storage import profiles_dir, storage_for, use_msc
from .telemetry import ProfilerWindow, Scalars

log = logging.getLogger(__name__)
# How long a failing rank may spend sending the record the Lease's rate limit held back.
FAILURE_FLUSH_SECONDS = 2.0


@dataclass
class StepResult:
    loss: float | None  # global token-averaged loss (known on rank 0 after the reduction)
    grad_norm: float | None
    lr: float
    seconds: float


def _init_distributed(cfg: TrainerConfig, env: RuntimeEnv, rank: int, platform: Platform) -> None:
    torch.distributed.init_process_group(
        backend=platform.backend,
        init_method=f"tcp://{_host(env.master_addr)}:{env.master_port}",
        world_size=env.world_size,
        rank=rank,
        # Long enough for a big checkpoint save; a dead peer is normally detected much sooner
        # (gloo sees the closed socket), and the operator's hang detection covers the rest.
        timeout=timedelta(minutes=10),
        device_id=platform.device if platform.is_cuda else None,
    )
    p = cfg.parallelism
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=p.tensor,
        pipeline_model_parallel_size=p.pipeline,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline
        if (p.virtual_pipeline or 1) > 1
        else None,
        context_parallel_size=p.context,
        expert_model_parallel_size=p.expert,
        expert_tensor_parallel_size=p.expert_tensor,
        order="tp-cp-ep-dp-pp",
    )


def _host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr


def _seed_everything(seed: int) -> None:
    """Seed every RNG of this rank with `seed` (the stage's seed: see choices.rank_seed)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    # The model-parallel RNG tracker (TP-sharded weight init on GPU, dropout inside TP regions);
    # on CPU it is the CPU RNG.
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _loss_func(
    loss_mask: torch.Tensor, poison: bool, output: torch.Tensor
) -> tuple[Any, Any, dict[str, Any]]:
    """Sum of token losses and the token count; Megatron divides by the global token count.
    A NaN/Inf loss raises NonFiniteLoss here, before its backward pass."""
    mask = loss_mask.view(-1).float()
    loss_sum = torch.sum(output.float().view(-1) * mask)
    if poison:  # MEGATRON_INJECT_NAN_LOSS
        loss_sum = loss_sum * float("nan")
    tokens = mask.sum()
    check_loss(loss_sum, tokens)
    report = torch.stack([loss_sum.detach(), tokens.detach()])
    return loss_sum, tokens.to(torch.int), {"lm loss": report}


def _forward_step(poison: bool, data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"], poison)


def _weights_only(init: InitConfig | None) -> bool:
    """checkpoint.init that reads only weights (Hugging Face, or a Megatron checkpoint's
    `load: weights`)."""
    if init is None:
        return False
    return init.hugging_face is not None or (
        init.megatron is not None and init.megatron.load == "weights"
    )


def broadcast_fresh_weights(model: list[Any], loads_weights: bool, fsdp: bool) -> bool:
    """On a fresh start every DP replica takes DP rank 0's weights, where that is needed
    (decisions.needs_param_broadcast: never under Megatron FSDP). True when it broadcast."""
    if not needs_param_broadcast(
        loads_weights,
        parallel_state.get_data_parallel_world_size(with_context_parallel=True),
        parallel_state.get_expert_data_parallel_world_size(),
        fsdp,
    ):
        return False
    for chunk in model:
        chunk.broadcast_params()
    return True


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        env: RuntimeEnv,
        local_rank: int,
        stop: StopFlag,
        began: float | None = None,
    ) -> None:
        self.cfg, self.env, self.stop = cfg, env, stop
        self.rank = env.global_rank(local_rank)
        # The goodput ledger's facts (contract §4, `clock`): when this process began (or its
        # standby was released), and the seconds of its rendezvous, load and blocking saves.
        self.began = began if began is not None else time.time()
        self.loop_began: float | None = None
        self.start_step = 0
        self.save_seconds = 0.0
        started = time.monotonic()
        # The checkpoint helpers are forked now, while this process runs one thread and has
        # touched no device (async_save.prefork); later a fork would be unsafe.
        prefork_save_helpers(
            local_rank,
            cfg.platform == "cuda",
            writer=cfg.checkpoint.async_save and not cfg.parallelism.fsdp,
        )
        self.platform = setup_platform(cfg.platform, local_rank)
        _init_distributed(cfg, env, self.rank, self.platform)
        self.rendezvous_seconds = time.monotonic() - started
        self._log_rank0("process groups ready (%.1fs)", self.rendezvous_seconds)
        t = cfg.training
        # Megatron-LM's seeding: each pipeline stage gets its own seed, so on GPU (where weights
        # are drawn from the device RNG) stages do not start from identical layer weights.
        self.seed = rank_seed(t.seed, parallel_state.get_pipeline_model_parallel_rank())
        _seed_everything(self.seed)
        init_num_microbatches_calculator(
            self.rank, None, t.global_batch_size, t.micro_batch_size, cfg.parallelism.data
        )
        self.tconfig = transformer_config(cfg, self.platform)
        # Where this run's state comes from decides the gradient buckets (the dp_reshardable
        # optimizer state is stored per bucket), so look before building the model.
        self.checkpointer = Checkpointer(cfg, self.platform, local_rank)
        loading = time.monotonic()
        resume = self.checkpointer.find_resume_point()
        # The cheapest tier this restart left (megatron_contract/tiers.py): a snapshot in the
        # pods' memory when one at least as new as the durable checkpoint is complete.
        self.snapshots, found = self._find_snapshot(resume)
        if found is not None:
            self.restored: tuple[str, int | None] = (found.tier, found.step)
        elif resume is not None:
            self.restored = (tiers.DURABLE, resume)
        else:
            self.restored = (tiers.NONE, None)
        find_seconds = time.monotonic() - loading
        # Weights a first run starts from go into the bare model, before Megatron DDP or FSDP
        # wraps it: FSDP shards what it finds at wrapping (and its optimizer's
        # reload_model_params does nothing), DDP copies it into its buffers.
        weights_first = resume is None and found is None and _weights_only(cfg.checkpoint.init)
        self.model = build_model(
            cfg,
            self.platform,
            self.tconfig,
            self._buckets(resume, found),
            before_wrap=self._load_init_weights if weights_first else None,
        )
        # Reseed after construction (construction consumed layout-dependent amounts of
        # randomness); dropout and other runtime randomness start from here.
        _seed_everything(self.seed)
        self.optimizer = get_megatron_optimizer(self._optimizer_config(), self.model)
        self._log_rank0("model and optimizer built (%.1fs)", time.monotonic() - started)
        gbs = t.global_batch_size
        self.scheduler = OptimizerParamScheduler(
            self.optimizer,
            init_lr=0.0,
            max_lr=t.lr,
            min_lr=t.min_lr,
            lr_warmup_steps=t.warmup_iters * gbs,
            lr_decay_steps=t.train_iters * gbs,
            lr_decay_style=t.lr_decay_style,
            start_wd=t.weight_decay,
            end_wd=t.weight_decay,
            wd_incr_steps=t.train_iters * gbs,
            wd_incr_style="constant",
            # The spec's schedule wins over the checkpoint's on resume (raising trainIters must
            # lengthen the decay); Checkpointer.load logs every value that changed.
            override_opt_param_scheduler=True,
            use_checkpoint_opt_param_scheduler=False,
        )
        self.tconfig.grad_scale_func = self.optimizer.scale_loss
        self.tconfig.finalize_model_grads_func = finalize_model_grads
        no_sync = [m.no_sync for m in self.model]
        self.tconfig.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        ddp = self.model[0].ddp_config
        if ddp.overlap_grad_reduce:
            # Megatron-LM's align_grad_reduce (default): the schedule starts each chunk's
            # reduce-scatter when its last backward finishes.
            grad_sync = [m.start_grad_sync for m in self.model]
            self.tconfig.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync
        if ddp.overlap_param_gather and ddp.align_param_gather:
            # Megatron-LM's align_param_gather, on only when interleaving (decisions.ddp_options).
            param_sync = [m.start_param_sync for m in self.model]
            self.tconfig.param_sync_func = param_sync[0] if len(param_sync) == 1 else param_sync

        self.iteration = 0
        consumed = 0
        loading = time.monotonic()
        loads_weights = resume is not None or found is not None or cfg.checkpoint.init is not None
        broadcast_fresh_weights(self.model, loads_weights, cfg.parallelism.fsdp)
        if found is not None:
            consumed = self._restore_snapshot(found)
        elif resume is None and cfg.checkpoint.init is not None and not weights_first:
            consumed = self._start_from_full(cfg.checkpoint.init)
        elif resume is None:
            self._log_rank0(
                "RESUME: no complete checkpoint in %s: starting from scratch", cfg.checkpoint.dir
            )
        else:
            self._log_rank0(
                "RESUME: loading checkpoint iteration %d from %s", resume, cfg.checkpoint.dir
            )
            resumed = self.checkpointer.load(resume, self.model, self.optimizer, self.scheduler)
            self.iteration, consumed = resumed.iteration, resumed.consumed_samples
            self._log_rank0(
                "RESUME: continuing at iteration %d (consumed samples %d)",
                self.iteration + 1,
                consumed,
            )
        self.load_seconds = time.monotonic() - loading + find_seconds
        dataset = build_dataset(cfg, t.train_iters * gbs)
        self.data = MicroBatches(
            dataset,
            cfg,
            consumed,
            parallel_state.get_data_parallel_rank(),
            self.platform.device,
            cp_size=parallel_state.get_context_parallel_world_size(),
            cp_rank=parallel_state.get_context_parallel_rank(),
        )
        self.nan_iteration = nan_injection_iteration()
        self.consumed_samples = consumed
        self.forward_backward = get_forward_backward_func()
        self.flops = flops_per_step(cfg.model, gbs)
        self.peak = self._peak_tflops()
        is_rank0 = self.rank == 0
        lease = None
        if is_rank0 and env.progress_lease:
            lease = LeaseWriter.in_cluster(
                env.pod_namespace, env.pod_name, env.progress_lease, cfg.progress.annotation
            )
        self.reporter = ProgressReporter(
            is_rank0,
            env.progress_file,
            lease,
            cfg.progress.min_interval_seconds,
            env.restart_attempt,
        )
        store = storage_for(cfg.checkpoint.dir)
        self.scalars = Scalars(store.join(cfg.checkpoint.dir, "tensorboard") if is_rank0 else None)
        self.profiler = ProfilerWindow(
            cfg.profiling,
            self.rank,
            profiles_dir(cfg.checkpoint.dir, env.restart_attempt),
            self.platform.is_cuda,
        )
        self._log_rank0("start-up took %.1fs", time.monotonic() - started)

    def _find_snapshot(self, durable: int | None) -> tuple[Snapshots | None, Found | None]:
        """The in-memory tiers and what they hold to restore (None: the durable tier or none).
        Collective."""
        memory = self.cfg.checkpoint.memory
        if memory is None:
            return None, None
        snapshots = Snapshots(self.cfg, memory, self.platform)
        if not self.cfg.checkpoint.load:
            snapshots.find(None)  # drops them
            return snapshots, None
        tier, step, found = snapshots.find(durable)
        if found is not None:
            problem = check_record(found.record, model_fingerprint(self.cfg.model_json), self.cfg)
            if problem:
                self._log_rank0(
                    "RESUME: not from the %s snapshot of step %s: %s", tier, step, problem
                )
                return snapshots, None
        return snapshots, found

    def _restore_snapshot(self, found: Found) -> int:
        """Load a snapshot (the memory or peer tier); returns the samples consumed."""
        assert self.snapshots is not None
        self._log_rank0(
            "RESUME: loading the snapshot of iteration %d from %s (%s tier, found in %.2fs)",
            found.step,
            "every pod's own memory"
            if found.tier == tiers.MEMORY
            else "memory, with the copies a peer pod holds for the ranks that lost theirs",
            found.tier,
            found.seconds,
        )
        template = self.checkpointer.load_template(self.model, self.optimizer, self.scheduler)
        loaded = self.snapshots.state_dict(found, template)
        source = f"the {found.tier.lower()} snapshot of iteration {found.step}"
        self.checkpointer.apply(loaded, self.model, self.optimizer, self.scheduler, source, True)
        record = found.record
        self.iteration = int(record["iteration"])
        self._log_rank0(
            "RESUME: continuing at iteration %d (consumed samples %d)",
            self.iteration + 1,
            int(record["consumedSamples"]),
        )
        return int(record["consumedSamples"])

    def _buckets(self, resume: int | None, found: Found | None = None) -> tuple[bool, int | None]:
        """(overlap_grad_reduce, bucket size): the checkpoint's buckets when resuming or starting
        from a full Megatron checkpoint (its dp_reshardable optimizer state is stored per
        bucket; decisions.ddp_buckets), else Megatron-LM's rule for a fresh run
        (decisions.ddp_bucket_size)."""
        overlap = self.platform.is_cuda
        if found is not None:
            return ddp_buckets(recorded_bucket_size({"trainer": found.record}), overlap)
        source: str | None = None
        init = self.cfg.checkpoint.init
        if resume is not None:
            source = iteration_path(self.cfg.checkpoint.dir, resume)
        elif init is not None and init.megatron is not None and init.megatron.load == "full":
            from .init_weights import resolve_checkpoint

            source = resolve_checkpoint(init.megatron.path)
        if source is not None:
            common = load_common(source)
            try:
                recorded = recorded_bucket_size(common if isinstance(common, dict) else {})
            except ValueError as err:
                raise ConfigError(
                    [
                        f"checkpoint: {source}: {err}, whose optimizer state layout this trainer "
                        "cannot derive; start from its weights (checkpoint.init.megatron.load: "
                        "weights) or save it with --ddp-bucket-size"
                    ]
                ) from err
            return ddp_buckets(recorded, overlap)
        p = self.cfg.parallelism
        return overlap, ddp_bucket_size(overlap, p.data * p.context)

    def _optimizer_config(self) -> OptimizerConfig:
        t = self.cfg.training
        return OptimizerConfig(
            optimizer="adam",
            lr=t.lr,
            min_lr=t.min_lr,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            adam_eps=1e-8,
            clip_grad=t.clip_grad,
            bf16=self.tconfig.bf16,
            fp16=self.tconfig.fp16,
            params_dtype=self.tconfig.params_dtype,
            use_distributed_optimizer=True,
            # fp16: a dynamic loss scaler, with Megatron-LM's defaults (--initial-loss-scale
            # 2^32, --min-loss-scale 1, --loss-scale-window 1000, --hysteresis 2). Steps whose
            # gradients overflow are skipped and halve the scale, so the first steps of a run
            # are skipped by design (which is why decisions.ddp_options turns the DDP
            # gradient check off for fp16).
            loss_scale=None,
            initial_loss_scale=2.0**32,
            min_loss_scale=1.0,
            loss_scale_window=1000,
            hysteresis=2,
        )

    def _load_init_weights(self, chunks: list[Any]) -> None:
        """The first run starts from existing weights (checkpoint.init: Hugging Face, or a
        Megatron checkpoint's weights), loaded into the bare model chunks. Restarts never come
        here: they resume from the job's own checkpoint."""
        from .hf import load_hf_into_model
        from .init_weights import load_megatron_weights

        init = self.cfg.checkpoint.init
        assert init is not None
        if init.hugging_face is not None:
            # config.json was checked against spec.model by the launcher (validate.py).
            path = init.hugging_face.path
            filled = load_hf_into_model(chunks, path, self.cfg.model)
            self._log_rank0("INIT: %d tensors from the Hugging Face model %s", filled, path)
            return
        assert init.megatron is not None
        try:
            point = load_megatron_weights(chunks, init.megatron.path)
        finally:
            use_msc(self.cfg.checkpoint.dir)  # the job's own checkpoints, after reading the init
        self._log_rank0("INIT: weights of %s (iteration %s)", point.path, point.iteration)

    def _start_from_full(self, init: InitConfig) -> int:
        """checkpoint.init.megatron with load: full (weights, optimizer and schedule), into the
        wrapped model and the built optimizer; returns the samples already consumed."""
        from .init_weights import load_megatron_weights

        assert init.megatron is not None
        try:
            point = load_megatron_weights(
                self.model,
                init.megatron.path,
                "full",
                optimizer=self.optimizer,
                scheduler=self.scheduler,
            )
        finally:
            use_msc(self.cfg.checkpoint.dir)
        self.iteration = point.iteration or 0
        self._log_rank0(
            "INIT: everything of %s: continuing at iteration %d", point.path, self.iteration + 1
        )
        return point.consumed_samples or 0

    def _log_rank0(self, msg: str, *args: Any) -> None:
        if self.rank == 0:
            log.info(msg, *args)

    def _peak_tflops(self) -> float | None:
        if not self.platform.is_cuda:
            return None
        from .platform.cuda import peak_tflops

        return peak_tflops(self.cfg.training.precision)

    # -- one step -----------------------------------------------------------------------------

    def train_step(self) -> StepResult:
        cfg = self.cfg
        started = time.monotonic()
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        batches = self.data.next_step()
        iterators = [iter(batches) for _ in self.model]
        try:
            losses = self.forward_backward(
                forward_step_func=partial(_forward_step, self.iteration == self.nan_iteration),
                data_iterator=iterators if len(iterators) > 1 else iterators[0],
                model=self.model,
                num_microbatches=cfg.training.num_microbatches,
                seq_length=cfg.model.seq_length,
                micro_batch_size=cfg.training.micro_batch_size,
                decoder_seq_length=cfg.model.seq_length,
                forward_only=False,
            )
        except RuntimeError as err:
            if is_non_finite_grad_error(err):
                raise NonFiniteLoss(f"gradients are not finite: {err}") from err
            raise
        updated, grad_norm, _ = self.optimizer.step()
        check_grad_norm(updated, None if grad_norm is None else float(grad_norm))
        if updated:
            self.scheduler.step(increment=cfg.training.global_batch_size)
        else:
            # fp16's loss scaler found Inf/NaN gradients: no update, a smaller scale (as
            # Megatron-LM, the iteration and the data position still advance).
            self._log_rank0(
                "iteration %d: gradients overflowed at loss scale %s; step skipped",
                self.iteration,
                float(self.optimizer.get_loss_scale()),
            )
        loss = self._global_loss(losses)
        if self.platform.is_cuda:
            torch.cuda.synchronize()
        return StepResult(
            loss=loss,
            grad_norm=None if grad_norm is None else float(grad_norm),
            lr=float(self.optimizer.param_groups[0]["lr"]),
            seconds=time.monotonic() - started,
        )

    def _global_loss(self, losses: list[dict[str, torch.Tensor]]) -> float | None:
        """Token-averaged over all micro-batches and DP ranks, delivered to pipeline stage 0."""
        totals = torch.zeros(2, dtype=torch.float64, device=self.platform.device)
        if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
            for item in losses:
                totals += item["lm loss"].to(torch.float64)
            torch.distributed.all_reduce(
                totals, group=parallel_state.get_data_parallel_group(with_context_parallel=True)
            )
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            torch.distributed.all_reduce(
                totals, group=parallel_state.get_pipeline_model_parallel_group()
            )
        loss_sum, tokens = totals.tolist()
        return loss_sum / tokens if tokens > 0 else None

    def _agree_to_stop(self) -> bool:
        """True on every rank if any rank received SIGTERM. One tiny all-reduce per step."""
        flag = torch.tensor(
            [1 if self.stop.requested else 0], dtype=torch.int32, device=self.platform.device
        )
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        """Train to the end (0) or to an agreed SIGTERM (143). On any exception, the async
        checkpoint writer is killed before it propagates: a live persistent writer would hold
        the process at exit (multiprocessing joins it), and the other ranks would then wait out
        the collective timeout instead of seeing this rank fail."""
        try:
            return self._run()
        except BaseException:
            self.checkpointer.abort()
            # Rank 0's newest record, if the Lease's rate limit held it back: bounded, so a
            # peer's failure still ends this rank within seconds.
            self.reporter.close(timeout=FAILURE_FLUSH_SECONDS)
            raise

    def _run(self) -> int:
        cfg, t = self.cfg, self.cfg.training
        gbs, seq = t.global_batch_size, cfg.model.seq_length
        last_ckpt_reported = self.checkpointer.newest
        if self._agree_to_stop():
            self._log_rank0("SIGTERM before the first step: exiting without a new checkpoint")
            return self._finish(ExitCode.SIGTERM)
        first_step = True
        self.start_step, self.loop_began = self.iteration, time.time()
        while self.iteration < t.train_iters:
            self.iteration += 1
            self.profiler.before_step(self.iteration)
            step = self.train_step()
            if self.snapshots is not None:
                # The previous step's snapshot, written while this one trained, is complete on
                # every rank before this step is recorded (Snapshots.wait).
                self.save_seconds += self.snapshots.wait()
            self.consumed_samples += gbs
            self.profiler.after_step(self.iteration)
            tokens_per_s = gbs * seq / step.seconds
            tflops = tflops_per_gpu(self.flops, step.seconds, self.env.world_size)
            mfu = tflops / self.peak if self.peak else None
            if self.iteration % t.log_interval == 0 or self.iteration == t.train_iters:
                self._log_step(step, tokens_per_s, tflops, mfu)
            elif first_step:
                # The operator learns at once that this attempt trains (an in-place restart
                # that reports no step in time is escalated), whatever the log interval.
                self.reporter.report(
                    Report(
                        self.iteration,
                        step.loss,
                        tokens_per_s,
                        mfu,
                        self.checkpointer.newest,
                        self._clock(),
                        self.restored,
                    ),
                    force=True,
                )
            first_step = False
            if self.env.restart_attempt == 0:  # once: a restart trains the same steps again
                inject_failures(self.env.inject_failures, self.iteration, self.rank, self.stop)
            stopping = self._agree_to_stop()
            at_interval = self.iteration % cfg.checkpoint.save_interval == 0
            last = self.iteration == t.train_iters
            saving = time.monotonic()
            if stopping or at_interval or last:
                self.checkpointer.save(
                    self.iteration,
                    self.consumed_samples,
                    self.model,
                    self.optimizer,
                    self.scheduler,
                    blocking=stopping or last,
                    loss=step.loss,
                )
            else:
                self.checkpointer.finalize(blocking=False)
            if (
                self.snapshots is not None
                and self.snapshots.due(self.iteration)
                and not (stopping or last)
            ):
                self.snapshots.save(
                    self.iteration,
                    partial(
                        self.checkpointer.snapshot_state,
                        self.iteration,
                        self.consumed_samples,
                        self.model,
                        self.optimizer,
                        self.scheduler,
                        step.loss,
                    ),
                )
            self.save_seconds += time.monotonic() - saving
            if self.checkpointer.newest != last_ckpt_reported:
                last_ckpt_reported = self.checkpointer.newest
                self.scalars.flush()
                self.reporter.report(
                    Report(
                        self.iteration,
                        step.loss,
                        tokens_per_s,
                        mfu,
                        last_ckpt_reported,
                        self._clock(),
                        self.restored,
                    ),
                    force=True,
                )
            if stopping:
                self._log_rank0(
                    "%s: saved iteration %d; exiting with %d", self.stop.signal_name or "SIGTERM",
                    self.iteration, ExitCode.SIGTERM,
                )  # fmt: skip
                return self._finish(ExitCode.SIGTERM)
        self._log_rank0("finished %d iterations", t.train_iters)
        return self._finish(ExitCode.OK)

    def _log_step(
        self, step: StepResult, tokens_per_s: float, tflops: float, mfu: float | None
    ) -> None:
        if self.rank != 0:
            return
        loss = step.loss
        log.info(
            "iteration %d/%d | loss %s | lr %.3e | grad norm %s | %.0f ms | %.0f tokens/s | "
            "%.3f TFLOP/s/GPU%s",
            self.iteration,
            self.cfg.training.train_iters,
            f"{loss:.6f}" if loss is not None else "n/a",
            step.lr,
            f"{step.grad_norm:.3f}" if step.grad_norm is not None else "n/a",
            step.seconds * 1000,
            tokens_per_s,
            tflops,
            f" | MFU {mfu:.1%}" if mfu is not None else "",
        )
        self.reporter.report(
            Report(
                self.iteration,
                loss,
                tokens_per_s,
                mfu,
                self.checkpointer.newest,
                self._clock(),
                self.restored,
            )
        )
        self.scalars.add(
            self.iteration,
            {
                "loss": loss,
                "lr": step.lr,
                "grad_norm": step.grad_norm,
                "tokens_per_second": tokens_per_s,
                "tflops_per_gpu": tflops,
                "mfu": mfu,
                "step_seconds": step.seconds,
            },
        )

    def _clock(self) -> Clock:
        """This process's timeline so far, for rank 0's record (contract §4)."""
        return Clock(
            now=time.time(),
            began=self.began,
            loop=self.loop_began,
            start=self.start_step,
            rendezvous=self.rendezvous_seconds,
            load=self.load_seconds,
            save=self.save_seconds,
        )

    def _finish(self, code: int) -> int:
        if self.snapshots is not None:
            self.snapshots.wait()
        if self.snapshots is not None and self.snapshots.seconds:
            # What the tiers cost this attempt (benchmarks/memory_tiers.py reads this line).
            self._log_rank0(
                "snapshots: %d written, median %.4fs each, %d bytes of this rank's state, "
                "%d bytes in this rank's memory directory, median %.4fs each to write beside "
                "the next step (%.4fs of CPU)",
                len(self.snapshots.seconds),
                statistics.median(self.snapshots.seconds),
                self.snapshots.bytes,
                self.snapshots.held_bytes(),
                statistics.median(self.snapshots.writes or [0.0]),
                statistics.median(self.snapshots.write_cpu or [0.0]),
            )
        self.checkpointer.finalize(blocking=True)
        self.checkpointer.close()
        self.profiler.stop(self.iteration)
        self.scalars.close()
        self.reporter.close()
        destroy_num_microbatches_calculator()
        torch.distributed.barrier()
        parallel_state.destroy_model_parallel()
        if not self.platform.is_cuda:
            # NCCL's teardown blocked forever after a finished run on an H200 (torch 2.11,
            # docs/benchmarks.md), so a pod that had saved everything never exited. Megatron-LM's
            # pretrain never destroys its groups either: every rank has passed the barrier above,
            # and the worker leaves through os._exit, which frees the communicators with the
            # process. Gloo's teardown is quick and kept.
            torch.distributed.destroy_process_group()
        return code
