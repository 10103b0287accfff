"""The resolved trainer configuration (docs/contract.md §2), built from a job and its plan (pure).

Everything is resolved here (recipe defaults, data-parallel size, padded vocabulary, precision) so
the trainer never re-derives a default and both sides agree by construction.
"""

from __future__ import annotations

from typing import Any

from .api.job import API_VERSION, MegatronJob
from .layout import Plan
from .names import CHECKPOINT_MOUNT
from .resolve import ResolvedModel


def checkpoint_dir(job: MegatronJob) -> str:
    sub = job.spec.checkpoint.path or job.name
    return f"{CHECKPOINT_MOUNT}/{sub}"


def _model(m: ResolvedModel, plan: Plan) -> dict[str, Any]:
    moe = None
    if m.moe is not None:
        moe = {
            "numExperts": m.moe.num_experts,
            "routerTopK": m.moe.router_top_k,
            "ffnHiddenSize": m.moe.ffn_hidden_size,
            "sharedExpertFfnHiddenSize": m.moe.shared_expert_ffn_hidden_size,
            "firstKDenseLayers": m.moe.first_k_dense_layers,
            "auxLossCoeff": m.moe.aux_loss_coeff,
            "tokenDispatcher": m.moe.token_dispatcher,
        }
    mla = None
    if m.mla is not None:
        mla = {
            "qLoraRank": m.mla.q_lora_rank,
            "kvLoraRank": m.mla.kv_lora_rank,
            "qkHeadDim": m.mla.qk_head_dim,
            "qkPosEmbHeadDim": m.mla.qk_pos_emb_head_dim,
            "vHeadDim": m.mla.v_head_dim,
        }
    return {
        "recipe": m.recipe,
        "numLayers": m.num_layers,
        "hiddenSize": m.hidden_size,
        "ffnHiddenSize": m.ffn_hidden_size,
        "numAttentionHeads": m.num_attention_heads,
        "numQueryGroups": m.num_query_groups,
        "kvChannels": m.kv_channels,
        "vocabSize": m.vocab_size,
        "paddedVocabSize": plan.padded_vocab_size,
        "seqLength": m.seq_length,
        "maxPositionEmbeddings": m.max_position_embeddings,
        "normalization": m.normalization,
        "activation": m.activation,
        "positionEmbedding": m.position_embedding,
        "ropeTheta": m.rope_theta,
        "untieEmbeddingsAndOutputWeights": m.untie_embeddings_and_output_weights,
        "normEpsilon": m.norm_epsilon,
        # Dropout is off: it is rarely used for pretraining, and its masks depend on the
        # layout, which would break loss equality across TP/PP/DP layouts.
        "attentionDropout": 0.0,
        "hiddenDropout": 0.0,
        "addBiasLinear": False,
        "moe": moe,
        "mla": mla,
    }


def trainer_config(job: MegatronJob, plan: Plan) -> dict[str, Any]:
    s = job.spec
    t = s.training
    data = s.data
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainerConfig",
        "job": {"name": job.name, "namespace": job.namespace, "uid": job.metadata.uid},
        "model": _model(plan.model, plan),
        "parallelism": plan.degrees.to_api(),
        "training": {
            "globalBatchSize": t.global_batch_size,
            "microBatchSize": t.micro_batch_size,
            "numMicrobatches": plan.num_microbatches,
            "trainIters": t.train_iters,
            "lr": t.lr,
            "minLr": t.min_lr,
            "warmupIters": t.warmup_iters,
            "lrDecayStyle": t.lr_decay_style,
            "weightDecay": t.weight_decay,
            "clipGrad": t.clip_grad,
            "adamBeta1": t.adam_beta1,
            "adamBeta2": t.adam_beta2,
            "precision": plan.precision,
            "seed": t.seed,
            "recompute": t.recompute,
            "logInterval": t.log_interval,
        },
        "data": {
            "mock": data.mock,
            "blend": [{"weight": b.weight, "prefix": b.prefix} for b in data.blend]
            if data.blend
            else None,
            "tokenizer": {"path": data.tokenizer.path} if data.tokenizer else None,
            "split": data.split,
            "numWorkers": 0,
        },
        "checkpoint": {
            "dir": checkpoint_dir(job),
            "saveInterval": s.checkpoint.save_interval,
            "async": s.checkpoint.async_,
            "keep": s.checkpoint.keep,
            "shardingType": s.checkpoint.sharding_type,
            "load": True,
        },
        "resources": {
            "accelerator": s.resources.accelerator,
            "nodes": plan.nodes,
            "procsPerNode": plan.procs_per_node,
        },
        "progress": {"annotation": "megatron.dev/progress", "minIntervalSeconds": 10},
        "profiling": {
            "startStep": s.profiling.start_step,
            "endStep": s.profiling.end_step,
            "ranks": list(s.profiling.ranks),
        }
        if s.profiling
        else None,
    }
