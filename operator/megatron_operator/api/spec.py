"""`MegatronJob.spec` (megatron.dev/v1alpha1): the source of truth for the CRD schema.

Field names are a public contract (examples, docs and tests use them): extend, never rename.
Every field carries a description, which the CRD generator copies so `kubectl explain` works.
Cross-field rules live in `megatron_operator.core.planner` (Python) and `cel.py` (the same rules as CEL).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from megatron_contract import choices, tiers
from megatron_contract.bounds import (
    MAX_BATCH,
    MAX_DURATION_SECONDS,
    MAX_EXPERTS,
    MAX_GPU_MEMORY_GIB,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_ITERATIONS,
    MAX_KEPT_ATTEMPTS,
    MAX_LAYERS,
    MAX_LR,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    MAX_RESTARTS,
    MAX_SEED,
    MAX_SEQUENCE,
    MAX_SPARE_NODES,
    MAX_VOCAB,
    MAX_WORLD_SIZE,
)
from megatron_contract.recipes import RECIPE_NAMES

from . import managedby
from .base import (
    ApiModel,
    AutoOrPositiveInt,
    DnsSubdomain,
    EnvName,
    Finite,
    LabelKey,
    LabelValue,
    NonNegativeInt,
    PositiveInt,
    QualifiedName,
    Quantity,
    SafePath,
    Seconds,
    Toleration,
    enum_schema,
    one_of,
    quantity_value,
)
from .template import PodTemplate

Precision = Annotated[str, one_of(choices.PRECISIONS), enum_schema(choices.PRECISIONS)]
Accelerator = Annotated[str, one_of(choices.ACCELERATORS), enum_schema(choices.ACCELERATORS)]
RecipeName = Annotated[str, one_of(RECIPE_NAMES), enum_schema(RECIPE_NAMES)]
Normalization = Annotated[str, one_of(choices.NORMALIZATIONS), enum_schema(choices.NORMALIZATIONS)]
Activation = Annotated[str, one_of(choices.ACTIVATIONS), enum_schema(choices.ACTIVATIONS)]
PositionEmbedding = Annotated[
    str, one_of(choices.POSITION_EMBEDDINGS), enum_schema(choices.POSITION_EMBEDDINGS)
]
TokenDispatcher = Annotated[
    str, one_of(choices.TOKEN_DISPATCHERS), enum_schema(choices.TOKEN_DISPATCHERS)
]
LrDecayStyle = Annotated[str, one_of(choices.LR_DECAY_STYLES), enum_schema(choices.LR_DECAY_STYLES)]
Recompute = Annotated[str, one_of(choices.RECOMPUTE), enum_schema(choices.RECOMPUTE)]
ShardingType = Annotated[str, one_of(choices.SHARDING_TYPES), enum_schema(choices.SHARDING_TYPES)]
ProfilerTool = Annotated[str, one_of(choices.PROFILERS), enum_schema(choices.PROFILERS)]

_DAYS = f" At most {MAX_DURATION_SECONDS} s ({MAX_DURATION_SECONDS // 86400} days)."
FailureAction = Literal["Restart", "RestartNotCounted", "Fail"]
# What the operator can tell about a failure besides the exit code. See docs/api.md.
FailureReason = Literal[
    "Error",
    "OOMKilled",
    "Evicted",
    "DisruptionTarget",
    "Preempted",
    "NodeLost",
    "PodDeleted",
    "Hang",
    "KueueEviction",
    "StartupTimeout",
    "LauncherLost",
    "RestartTimeout",
]
RestartStrategy = Literal["InPlace", "Recreate"]


class MoeSpec(ApiModel):
    """Mixture-of-experts settings. Present only for MoE models."""

    num_experts: PositiveInt | None = Field(
        None,
        le=MAX_EXPERTS,
        description="Routed experts per MoE layer (required unless the recipe sets it).",
    )
    router_top_k: PositiveInt | None = Field(
        None,
        le=MAX_EXPERTS,
        description="Experts each token is routed to (required unless the recipe sets it).",
    )
    ffn_hidden_size: PositiveInt | None = Field(
        None,
        le=MAX_HIDDEN,
        description="Hidden size of each expert's MLP. Defaults to model.ffnHiddenSize.",
    )
    shared_expert_ffn_hidden_size: PositiveInt | None = Field(
        None,
        le=MAX_HIDDEN,
        description="Total hidden size of the shared experts (DeepSeek style); unset: none.",
    )
    first_k_dense_layers: NonNegativeInt | None = Field(
        None, le=MAX_LAYERS, description="The first K layers use a dense MLP instead of experts."
    )
    aux_loss_coeff: Finite | None = Field(
        None, ge=0, le=100, description="Load-balancing auxiliary loss coefficient (default 0.01)."
    )
    token_dispatcher: TokenDispatcher | None = Field(
        None, description="Megatron-Core token dispatcher (default alltoall)."
    )
    router_pre_softmax: bool | None = Field(
        None,
        description="Softmax over every expert's score, then top-k (DeepSeek-V2's routing); "
        "default false: top-k, then softmax over the k chosen (Mixtral's).",
    )


class MlaSpec(ApiModel):
    """Multi-latent attention (DeepSeek-V2/V3). Present only for MLA models; needs CUDA."""

    q_lora_rank: PositiveInt | None = Field(
        None, le=MAX_HIDDEN, description="Query LoRA rank; unset: no query compression."
    )
    kv_lora_rank: PositiveInt = Field(le=MAX_HIDDEN, description="Key/value compression rank.")
    qk_head_dim: PositiveInt = Field(
        le=MAX_HIDDEN, description="Per-head query/key dimension without RoPE."
    )
    qk_pos_emb_head_dim: PositiveInt = Field(
        le=MAX_HIDDEN, description="Per-head query/key RoPE dimension."
    )
    v_head_dim: PositiveInt = Field(le=MAX_HIDDEN, description="Per-head value dimension.")


RopeScalingType = Annotated[
    str, one_of(choices.ROPE_SCALING_TYPES), enum_schema(choices.ROPE_SCALING_TYPES)
]


class RopeScalingSpec(ApiModel):
    """RoPE frequency scaling for a longer context (Hugging Face's rope_scaling)."""

    type: RopeScalingType = Field(
        description="llama3 (Llama 3.1's); yarn (DeepSeek-V2's long-context extension) is "
        "refused: this trainer does not implement it."
    )
    factor: Finite = Field(gt=1, le=1024, description="Scaling factor, e.g. 8 (Llama 3.1).")
    low_freq_factor: Finite = Field(1.0, gt=0, le=1024, description="llama3: low_freq_factor.")
    high_freq_factor: Finite = Field(4.0, gt=0, le=1024, description="llama3: high_freq_factor.")
    original_max_position_embeddings: PositiveInt = Field(
        8192, le=MAX_SEQUENCE, description="The context the model was first trained at."
    )


class ModelSpec(ApiModel):
    """The model: a built-in recipe, with any field given here overriding the recipe's value."""

    recipe: RecipeName | None = Field(
        None,
        description="Built-in preset that supplies defaults for every field below. Without a "
        "recipe, numLayers, hiddenSize, numAttentionHeads, vocabSize and seqLength are required.",
    )
    num_layers: PositiveInt | None = Field(None, le=MAX_LAYERS, description="Transformer layers.")
    hidden_size: PositiveInt | None = Field(
        None, le=MAX_HIDDEN, description="Model (embedding) dimension."
    )
    ffn_hidden_size: PositiveInt | None = Field(
        None, le=MAX_HIDDEN, description="MLP hidden size (default 4 × hiddenSize)."
    )
    num_attention_heads: PositiveInt | None = Field(
        None, le=MAX_HEADS, description="Attention heads."
    )
    num_query_groups: PositiveInt | None = Field(
        None,
        le=MAX_HEADS,
        description="Key/value head groups for grouped-query attention (default: heads).",
    )
    kv_channels: PositiveInt | None = Field(
        None,
        le=MAX_HIDDEN,
        description="Per-head dimension (default hiddenSize / numAttentionHeads).",
    )
    vocab_size: PositiveInt | None = Field(
        None, le=MAX_VOCAB, description="Tokenizer vocabulary size before padding."
    )
    seq_length: PositiveInt | None = Field(
        None, le=MAX_SEQUENCE, description="Training sequence length in tokens."
    )
    max_position_embeddings: PositiveInt | None = Field(
        None,
        le=MAX_SEQUENCE,
        description="Maximum positions the model supports (default seqLength).",
    )
    normalization: Normalization | None = Field(
        None, description="Normalization layer (default RMSNorm)."
    )
    activation: Activation | None = Field(None, description="MLP activation (default swiglu).")
    position_embedding: PositionEmbedding | None = Field(
        None, description="Position embedding (default rope)."
    )
    rope_theta: Finite | None = Field(
        None, gt=0, le=1e12, description="RoPE base frequency (default 10000)."
    )
    untie_embeddings_and_output_weights: bool | None = Field(
        None, description="Separate input embedding and output layer weights (default true)."
    )
    norm_epsilon: Finite | None = Field(
        None, gt=0, le=1, description="Normalization epsilon (default 1e-5)."
    )
    rope_scaling: RopeScalingSpec | None = Field(
        None, description="RoPE frequency scaling (Llama 3.1 style); unset: plain RoPE."
    )
    moe: MoeSpec | None = Field(
        None, description="Mixture-of-experts settings; unset: dense model."
    )
    mla: MlaSpec | None = Field(
        None, description="Multi-latent attention; unset: standard attention."
    )


class ParallelismSpec(ApiModel):
    """How the model is split across GPUs. Megatron-Core's rank order is tp-cp-ep-dp-pp."""

    tensor: PositiveInt = Field(
        1, le=MAX_PROCS_PER_NODE, description="Tensor-parallel size (TP). Must divide procsPerNode."
    )
    pipeline: PositiveInt = Field(1, le=MAX_LAYERS, description="Pipeline-parallel size (PP).")
    virtual_pipeline: PositiveInt | None = Field(
        None,
        le=MAX_LAYERS,
        description="Virtual pipeline stages per pipeline rank (interleaved schedule); needs "
        "pipeline > 1.",
    )
    context: PositiveInt = Field(
        1, le=MAX_WORLD_SIZE, description="Context-parallel size (CP); CUDA only."
    )
    expert: PositiveInt = Field(
        1, le=MAX_EXPERTS, description="Expert-parallel size (EP); MoE models only, CUDA only."
    )
    expert_tensor: PositiveInt | None = Field(
        None,
        le=MAX_PROCS_PER_NODE,
        description="Tensor-parallel size inside experts (ETP); defaults to tensor.",
    )
    data: AutoOrPositiveInt = Field(
        "auto",
        description="Data-parallel size (DP): 'auto' derives nodes × procsPerNode / (tensor × "
        "pipeline × context); an integer must equal that.",
    )
    sequence_parallel: bool | None = Field(
        None,
        description="Sequence parallelism; needs tensor > 1, and is required for MoE with TP. "
        "Unset: on when tensor > 1 on GPUs (Megatron's guidance: without it every tensor-parallel "
        "rank keeps a copy of the norm and dropout activations), off otherwise.",
    )
    fsdp: bool = Field(
        False,
        description="Megatron FSDP (use_megatron_fsdp): shard parameters, gradients and optimizer "
        "state over the data-parallel ranks instead of replicating the weights. Combines with "
        "tensor, context and expert parallelism, not with pipeline; CUDA only.",
    )
    auto: bool = Field(
        False,
        description="Let the operator choose the layout: the best-ranked valid layout that fits "
        "gpuMemoryGiB (see mjob plan --suggest), written to status.parallelism. Leave the degrees "
        "and fsdp unset with it; a resize (nodes or procsPerNode) re-plans.",
    )


class TrainingSpec(ApiModel):
    """Optimisation settings."""

    global_batch_size: PositiveInt = Field(
        le=MAX_BATCH,
        description="Sequences per optimizer step; fixed for the life of the job (and across resumes).",
    )
    micro_batch_size: PositiveInt = Field(
        1, le=MAX_BATCH, description="Sequences per forward pass per rank."
    )
    train_iters: PositiveInt = Field(le=MAX_ITERATIONS, description="Optimizer steps to train for.")
    lr: Finite = Field(3.0e-4, gt=0, le=MAX_LR, description="Peak learning rate.")
    min_lr: Finite = Field(3.0e-5, ge=0, le=MAX_LR, description="Final learning rate after decay.")
    warmup_iters: NonNegativeInt = Field(0, le=MAX_ITERATIONS, description="Linear warmup steps.")
    lr_decay_style: LrDecayStyle = Field("cosine", description="Learning-rate decay after warmup.")
    weight_decay: Finite = Field(0.1, ge=0, le=10, description="AdamW weight decay.")
    clip_grad: Finite = Field(
        1.0, ge=0, le=1e6, description="Gradient-norm clipping threshold (0: off)."
    )
    adam_beta1: Finite = Field(0.9, gt=0, lt=1, description="AdamW beta1.")
    adam_beta2: Finite = Field(0.95, gt=0, lt=1, description="AdamW beta2.")
    precision: Precision | None = Field(
        None,
        description="Training precision (default bf16 on GPUs, fp32 with accelerator none). fp8 "
        "needs Transformer Engine; CPU needs fp32.",
    )
    seed: NonNegativeInt = Field(
        1234, le=MAX_SEED, description="Random seed for weights, dropout and data order."
    )
    recompute: Recompute = Field(
        "none", description="Activation recomputation: trades compute for memory."
    )
    log_interval: PositiveInt = Field(
        10, le=MAX_ITERATIONS, description="Steps between progress reports (loss, tokens/s, MFU)."
    )


class BlendItem(ApiModel):
    """One indexed dataset (.bin/.idx, as written by `mjob preprocess`) in a weighted blend."""

    weight: Finite = Field(gt=0, le=1e9, description="Relative sampling weight.")
    prefix: SafePath = Field(
        min_length=1, max_length=4096, description="Path prefix of the .bin/.idx pair in the pod."
    )


class TokenizerSpec(ApiModel):
    """A Hugging Face tokenizer read from a local directory (no hub access)."""

    path: SafePath = Field(
        min_length=1, max_length=4096, description="Directory holding tokenizer.json, in the pod."
    )


# One segment of checkpoint.path: letters, digits, '.', '_' and '-', but not '.' or '..' (which
# would leave the volume). Spelled without look-ahead: the apiserver's regex engine has none.
_SEGMENT = r"([A-Za-z0-9_-][A-Za-z0-9._-]*|[.][A-Za-z0-9_-][A-Za-z0-9._-]*|[.][.][A-Za-z0-9._-]+)"
CHECKPOINT_PATH_PATTERN = f"^{_SEGMENT}(/{_SEGMENT})*$"


class DataVolume(ApiModel):
    """An existing claim holding the datasets, mounted at /mnt/data (env MEGATRON_DATA_DIR)."""

    claim_name: DnsSubdomain = Field(description="The PersistentVolumeClaim (Lustre, FSx, NFS, …).")
    read_only: bool = Field(True, description="Mount read-only (the default: training reads data).")
    sub_path: str | None = Field(
        None,
        pattern=CHECKPOINT_PATH_PATTERN,
        max_length=4096,
        description="A directory inside the claim to mount instead of its root.",
    )


class InitVolume(ApiModel):
    """An existing claim holding the weights to start from, mounted read-only at /mnt/init (env
    MEGATRON_INIT_DIR); checkpoint.init's path is then a path under /mnt/init."""

    claim_name: DnsSubdomain = Field(description="The PersistentVolumeClaim.")
    sub_path: str | None = Field(
        None,
        pattern=CHECKPOINT_PATH_PATTERN,
        max_length=4096,
        description="A directory inside the claim to mount instead of its root.",
    )


class DataSpec(ApiModel):
    """Training data: either mock data or a weighted blend of preprocessed datasets, and the
    volume they are on. With spec.trainer.command, mock and blend are optional."""

    volume: DataVolume | None = Field(
        None, description="A claim with the datasets, mounted at /mnt/data (read-only by default)."
    )
    mock: bool = Field(False, description="Synthetic token data, for smoke tests and benchmarks.")
    blend: list[BlendItem] | None = Field(
        None, min_length=1, max_length=256, description="Weighted datasets; exclusive with mock."
    )
    tokenizer: TokenizerSpec | None = Field(None, description="Tokenizer; required with blend.")
    split: str = Field(
        "100,0,0",
        pattern=r"^[0-9]{1,9},[0-9]{1,9},[0-9]{1,9}$",
        max_length=64,
        description="Train,valid,test split weights.",
    )


Fabric = Literal["none", "infiniband", "roce", "efa"]
# The device-plugin resource of each fabric, unless network.resourceName names another: the
# NVIDIA Network Operator's RDMA shared device plugin is configured with such names, and the AWS
# EFA device plugin always advertises vpc.amazonaws.com/efa (docs/networking.md).
FABRIC_RESOURCES: Final[dict[str, str]] = {
    "none": "",
    "infiniband": "rdma/ib",
    "roce": "rdma/roce",
    "efa": "vpc.amazonaws.com/efa",
}


class NetworkSpec(ApiModel):
    """The fabric between nodes: its device-plugin resource, IPC_LOCK and the NCCL/libfabric
    env it needs (docs/networking.md)."""

    fabric: Fabric = Field(
        "none",
        description="none (TCP sockets), infiniband, roce (RDMA over Ethernet) or efa (AWS).",
    )
    resource_name: QualifiedName | None = Field(
        None,
        description="The device plugin's resource; default rdma/ib (infiniband), rdma/roce "
        "(roce), vpc.amazonaws.com/efa (efa).",
    )
    devices: PositiveInt = Field(
        1,
        le=64,
        description="Devices of that resource per pod: 1 for a shared RDMA device, the adapter "
        "count for EFA (4 on p4d.24xlarge, 32 on p5.48xlarge).",
    )
    ipc_lock: bool = Field(
        True,
        description="Add the IPC_LOCK capability (RDMA registration pins memory), which only "
        "Pod Security's privileged level allows. false where the nodes' container runtime "
        "raises RLIMIT_MEMLOCK for every container (e.g. containerd's LimitMEMLOCK=infinity): "
        "the pods then pass the restricted level.",
    )


class ResourcesSpec(ApiModel):
    """Nodes, GPUs and per-pod resources. One pod runs on each node."""

    nodes: PositiveInt = Field(
        le=MAX_NODES, description=f"Pods (one per node); at most {MAX_NODES}."
    )
    procs_per_node: PositiveInt = Field(
        le=MAX_PROCS_PER_NODE,
        description="Ranks per pod: one per GPU with nvidia.com/gpu, CPU processes with none. "
        f"At most {MAX_PROCS_PER_NODE}, and nodes × procsPerNode at most {MAX_WORLD_SIZE}.",
    )
    accelerator: Accelerator = Field(
        "nvidia.com/gpu", description="GPU resource to request per pod, or none for CPU training."
    )
    gpu_memory_gib: Finite = Field(
        80.0,
        gt=0,
        le=MAX_GPU_MEMORY_GIB,
        alias="gpuMemoryGiB",
        description="Memory per GPU; the planner's budget.",
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra per-pod requests (cpu, memory, rdma/...). The GPU request is set for you.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=64,
        description="Per-pod limits. A resource named rdma/* adds IPC_LOCK.",
    )
    shm_size: Quantity = Field("16Gi", description="Size of the memory-backed /dev/shm.")
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Node labels every pod must match."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Tolerations added to every pod."
    )
    network: NetworkSpec = Field(
        default_factory=NetworkSpec, description="The inter-node fabric (default: none)."
    )
    spare_nodes: NonNegativeInt = Field(
        0,
        le=MAX_SPARE_NODES,
        description="Warm spare pods kept beside the gang (same resources, same topology "
        "domain, image pulled, launcher and imports ready), counted in the Kueue Workload's "
        "quota. A lost node's rank moves onto a spare in seconds, without creating or "
        "scheduling a pod; a new spare is created afterwards. Needs restartPolicy.strategy "
        f"InPlace. At most {MAX_SPARE_NODES}, and nodes + spareNodes at most {MAX_NODES}.",
    )

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourcesSpec:
        # Also a CEL rule (cel.py): the apiserver refuses a pod whose request is above its
        # limit, so the job must be refused before any pod is rendered.
        above = [
            k
            for k, v in self.requests.items()
            if k in self.limits and quantity_value(v) > quantity_value(self.limits[k])
        ]
        if above:
            raise ValueError(
                f"resources.requests is above resources.limits for {', '.join(sorted(above))}: "
                "a pod may not request more than its limit; raise the limit or lower the request"
            )
        # Extended resources (rdma/ib, ...) and huge pages cannot be overcommitted: the
        # apiserver wants a limit, equal to the request when both are given.
        uneven = [
            k
            for k in self.requests
            if (("/" in k and "kubernetes.io/" not in k) or k.startswith("hugepages-"))
            and k != self.accelerator  # refused on its own: the operator sets it
            and (
                k not in self.limits
                or quantity_value(self.requests[k]) != quantity_value(self.limits[k])
            )
        ]
        if uneven:
            raise ValueError(
                f"resources.requests of {', '.join(sorted(uneven))} needs an equal "
                "resources.limits entry (extended resources and huge pages are not "
                "overcommitted): set the limit, or give only the limit"
            )
        return self

    @model_validator(mode="after")
    def _world_size_cap(self) -> ResourcesSpec:
        # Also a CEL rule (cel.py): the apiserver refuses the same specs.
        world = self.nodes * self.procs_per_node
        if world > MAX_WORLD_SIZE:
            raise ValueError(
                f"resources.nodes × resources.procsPerNode is {world}, above the cap of "
                f"{MAX_WORLD_SIZE} ranks: use fewer nodes or processes per node"
            )
        return self

    @model_validator(mode="after")
    def _pods_cap(self) -> ResourcesSpec:
        # Also a CEL rule (cel.py): every pod of the job, spares included, is rendered.
        pods = self.nodes + self.spare_nodes
        if pods > MAX_NODES:
            raise ValueError(
                f"resources.nodes + resources.spareNodes is {pods}, above the cap of "
                f"{MAX_NODES} pods: use fewer spare nodes"
            )
        return self


class TopologySpec(ApiModel):
    """Packing of the job's pods into one topology domain (a rack, an NVLink domain)."""

    key: QualifiedName | None = Field(
        None, description="Node label key of the domain, e.g. a rack label."
    )
    mode: Literal["required", "preferred", "none"] = Field(
        "none", description="required: all pods in one domain; preferred: best effort; none: off."
    )


AccessMode = Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]


RetentionAction = Literal["Retain", "Delete"]


class PvcRetentionPolicy(ApiModel):
    """What happens to a created claim when its job goes (as StatefulSet's
    persistentVolumeClaimRetentionPolicy)."""

    when_deleted: RetentionAction = Field(
        "Retain",
        description="Retain: the claim outlives the job (no ownerReference; labelled with the "
        "job's name and uid), and a job re-created with the same name resumes from it. Delete: "
        "the garbage collector deletes it with the job (e.g. after ttlSecondsAfterFinished).",
    )


class PvcCreate(ApiModel):
    """A PersistentVolumeClaim the operator creates (kept after the job unless
    retentionPolicy.whenDeleted is Delete)."""

    storage_class_name: DnsSubdomain | None = Field(
        None, description="StorageClass; unset: the default."
    )
    size: Quantity = Field(description="Requested capacity, e.g. 500Gi.")
    access_modes: list[AccessMode] = Field(
        default=["ReadWriteMany"],
        min_length=1,
        max_length=3,
        description="Access modes; multi-node jobs need ReadWriteMany.",
    )
    retention_policy: PvcRetentionPolicy = Field(
        default_factory=PvcRetentionPolicy,
        description="Whether the claim (the job's checkpoints) outlives the job; default: Retain.",
    )


class VolumeSpec(ApiModel):
    """Where checkpoints live: an existing claim, or one the operator creates."""

    claim_name: DnsSubdomain | None = Field(None, description="An existing PersistentVolumeClaim.")
    create: PvcCreate | None = Field(None, description="Create a claim named <job>-checkpoints.")


# msc://PROFILE/PATH: a profile name, then a path of the same safe segments as checkpoint.path.
MSC_URL_PATTERN = f"^msc://[A-Za-z0-9][A-Za-z0-9_-]{{0,62}}/{_SEGMENT}(/{_SEGMENT})*$"
ConfigKey = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]

InitLoad = Annotated[str, one_of(choices.INIT_LOADS), enum_schema(choices.INIT_LOADS)]


class MegatronInitSpec(ApiModel):
    """A Megatron-LM or NeMo torch_dist checkpoint to start from."""

    path: SafePath = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^(/|msc://)",
        description="Absolute path in the pod of the checkpoint directory (the one holding "
        "latest_checkpointed_iteration.txt) or of one iter_* directory, or an msc://PROFILE/PATH "
        "URL (read with the job's checkpoint.msc config).",
    )
    load: InitLoad = Field(
        "weights",
        description="weights: the model only, starting at iteration 0; full: also the optimizer, "
        "the scheduler and the iteration (needs a layout the optimizer state can reshard to).",
    )


class HuggingFaceInitSpec(ApiModel):
    """A Hugging Face Llama-family model directory to start from (no hub access)."""

    path: SafePath = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^/",
        description="Absolute path in the pod of a directory with config.json and safetensors; "
        "spec.model must describe the same architecture (checked at start, exit 78 otherwise).",
    )


class InitSpec(ApiModel):
    """Where the first run starts from; every restart resumes from the job's own checkpoint."""

    volume: InitVolume | None = Field(
        None,
        description="A claim with the weights, mounted read-only at /mnt/init: the source's path "
        "must then be under /mnt/init.",
    )
    megatron: MegatronInitSpec | None = Field(
        None, description="Start from a Megatron-LM / NeMo torch_dist checkpoint."
    )
    hugging_face: HuggingFaceInitSpec | None = Field(
        None, description="Start from Hugging Face weights (converted at any TP/PP on load)."
    )


class MscSpec(ApiModel):
    """multi-storage-client settings for checkpoint.url."""

    config_secret: DnsSubdomain = Field(
        description="A Secret in the job's namespace whose key configKey holds the MSC config "
        "(profiles and credentials), mounted read-only in the pods as MSC_CONFIG."
    )
    config_key: ConfigKey = Field(
        "msc_config.yaml", description="The Secret's key holding the config (YAML or JSON)."
    )


class MemoryCheckpointSpec(ApiModel):
    """In-memory checkpoints: each rank's state in its pod's memory, restored from the cheapest
    tier the failure leaves (docs/runbook.md, "Checkpoint tiers")."""

    interval: NonNegativeInt = Field(
        tiers.DEFAULT_INTERVAL,
        le=MAX_ITERATIONS,
        description="Steps between snapshots of every rank's state into its pod's memory "
        "volume; 0 turns the in-memory tiers off. Only with restartPolicy.strategy InPlace "
        "(a recreated pod keeps no memory), not with parallelism.fsdp. The memory counts "
        "against the pod's: mjob plan prints how much.",
    )
    replica: bool = Field(
        True,
        description="Also keep each rank's snapshot in the next pod's memory, so that the ranks "
        "of a replaced pod restore from it instead of the durable checkpoint (with two or more "
        "nodes). Doubles the memory the tiers hold.",
    )


class CheckpointSpec(ApiModel):
    """torch_dist checkpoints in the Megatron-LM layout; the trainer resumes from the newest."""

    volume: VolumeSpec | None = Field(
        None, description="The volume holding checkpoints (exactly one of volume and url)."
    )
    url: str | None = Field(
        None,
        pattern=MSC_URL_PATTERN,
        max_length=4096,
        description="Object storage instead of a volume: msc://PROFILE/PATH, a multi-storage-"
        "client URL as Megatron-Core reads it (S3, GCS, Azure, ... per the profile). Needs "
        "checkpoint.msc.configSecret.",
    )
    msc: MscSpec | None = Field(None, description="The MSC config for checkpoint.url.")
    path: str | None = Field(
        None,
        pattern=CHECKPOINT_PATH_PATTERN,
        max_length=4096,
        description="Directory inside the volume (default: the job name); relative, with no "
        "'.' or '..' segment. Not used with url (the URL names the directory).",
    )
    save_interval: PositiveInt = Field(
        1000, le=MAX_ITERATIONS, description="Steps between checkpoints."
    )
    async_: bool = Field(
        False, alias="async", description="Write checkpoints in the background (fewer stalls)."
    )
    keep: NonNegativeInt = Field(
        2, le=MAX_ITERATIONS, description="Newest checkpoints to keep (0 keeps all)."
    )
    sharding_type: ShardingType = Field(
        "dp_reshardable",
        description="Distributed-optimizer layout. fully_reshardable allows TP/PP changes on "
        "resume but saves slower. Megatron FSDP (parallelism.fsdp) saves the fsdp_dtensor "
        "format instead, which this does not apply to.",
    )
    grace_period_seconds: PositiveInt = Field(
        300,
        le=MAX_DURATION_SECONDS,
        description="Pod termination grace period: time to save a checkpoint on SIGTERM." + _DAYS,
    )
    init: InitSpec | None = Field(
        None, description="Start the first run from existing weights (exactly one source)."
    )
    memory: MemoryCheckpointSpec = Field(
        default_factory=MemoryCheckpointSpec,
        description="In-memory checkpoints between the durable ones (at most one step lost per "
        "in-place restart or replaced pod).",
    )


class FailureRule(ApiModel):
    """One failure rule: the first matching rule decides what a pod failure does."""

    action: FailureAction = Field(
        description="Restart (counts toward maxRestarts), RestartNotCounted (counts too once a "
        "job had 10 uncounted restarts in the last hour), or Fail."
    )
    exit_codes: list[Annotated[int, Field(ge=0, le=255)]] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Matches when the trainer's exit code is one of these.",
    )
    reasons: list[FailureReason] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="Matches when the failure reason is one of these.",
    )


class RestartPolicySpec(ApiModel):
    """Restarts: any rank failing restarts every rank as the next attempt, on the lowest rung
    that can (in place, replacing a lost pod, or recreating every pod; docs/runbook.md)."""

    strategy: RestartStrategy = Field(
        "InPlace",
        description="InPlace: a failed rank restarts every rank inside the running pods, a lost "
        "pod is replaced alone, and every pod is recreated only when that fails. Recreate: "
        "every failure recreates every pod.",
    )
    max_restarts: NonNegativeInt = Field(
        3, le=MAX_RESTARTS, description="Counted restarts before the job fails."
    )
    backoff_seconds: Seconds = Field(
        10,
        description="Wait before attempt k+1: backoffSeconds · 2^k, capped, and never under 1 s "
        "(the operator's restart-loop floor)." + _DAYS,
    )
    max_backoff_seconds: Seconds = Field(300, description="Cap on the backoff." + _DAYS)
    hang_timeout_seconds: Seconds = Field(
        1800,
        description="Restart with reason Hang when Running without progress this long (0: off). "
        "Until its first training step a new gang is held to firstStepTimeoutSeconds (or this, "
        "if longer), and an in-place restart or a pod replacement to inPlaceTimeoutSeconds."
        + _DAYS,
    )
    first_step_timeout_seconds: int = Field(
        1800,
        ge=1,
        le=MAX_DURATION_SECONDS,
        description="A new gang (the first attempt, or every pod recreated) that reports no "
        "training step this long after all its pods run restarts with reason Hang; its ranks "
        "import, rendezvous and load the checkpoint first. The larger of this and "
        "hangTimeoutSeconds applies; hangTimeoutSeconds 0 turns both off." + _DAYS,
    )
    startup_timeout_seconds: Seconds = Field(
        1800,
        description="A gang not Running this long after its first pod was scheduled (an image "
        "that cannot be pulled, a missing Secret, pods that never all fit) releases its GPUs: "
        "its pods are deleted and the failure (reason StartupTimeout) goes through the rules "
        "(default: a counted restart). 0: off." + _DAYS,
    )
    keep_failed_pods: NonNegativeInt = Field(
        1,
        le=MAX_KEPT_ATTEMPTS,
        description="Keep the failed pod of this many latest failed attempts (Failed, holding "
        "nothing, with its logs for kubectl logs); 0 deletes every pod of a failed attempt.",
    )
    in_place_timeout_seconds: int = Field(
        900,
        ge=1,
        le=MAX_DURATION_SECONDS,
        description="An in-place restart or pod replacement whose ranks report no training step "
        "within this long (after the backoff) recreates every pod (reason RestartTimeout)." + _DAYS,
    )
    recreate_on_repeated_node_failure: bool = Field(
        True,
        description="A node where a failure caused a restart before, since the gang was last "
        "recreated (status.failedNodes), failing again recreates every pod. false: it takes the "
        "lowest rung like any other failure (in place, or its pod replaced), which keeps the "
        "in-memory checkpoints (a recreate resumes from the durable checkpoint).",
    )
    rules: list[FailureRule] = Field(
        default_factory=list,
        max_length=32,
        description="Ordered rules, tried before the built-in defaults (see docs/api.md).",
    )


class TrainerSpec(ApiModel):
    """Your own training code instead of the built-in trainer: the launcher runs it once per
    rank, with the same env contract, signals, restarts and checkpoint volume."""

    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        min_length=1,
        max_length=64,
        description="The command each rank runs, e.g. [python, pretrain_gpt.py]; $(VAR) expands "
        "from the rank's env (RANK, MEGATRON_TP, MEGATRON_CHECKPOINT_DIR, …) as Kubernetes "
        "expands a container's args, $$ is a literal $.",
    )
    args: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list,
        max_length=1024,
        description="Its arguments, expanded the same way.",
    )
    progress: Literal["MegatronLog", "File", "None"] = Field(
        "MegatronLog",
        description="Where the launchers read the job's progress (steps, loss, checkpoints) "
        "for status.progress, the hang rule, the metrics and the alerts. MegatronLog: the "
        "ranks' own output (Megatron-LM's and Megatron Bridge's `iteration N/ M | ... | lm loss: "
        "X |` lines of the last rank, rank 0's `successfully saved checkpoint` lines), and the "
        "MEGATRON_PROGRESS_LOG file; File: that file only; None: no progress source, so no hang "
        "rule (hangTimeoutSeconds is not applied) and no MegatronJobNoProgress alert.",
    )


class EnvVar(ApiModel):
    """An extra environment variable for the trainer container."""

    name: EnvName = Field(description="Variable name: letters, digits and '_', not first a digit.")
    value: str = Field("", max_length=32768, description="Value.")


class ProfilingSpec(ApiModel):
    """A profiler window over steps [startStep, endStep] on the listed ranks; one capture per rank
    in <checkpoint dir>/profiles/<restart attempt>/ (`mjob profiles` lists and copies them)."""

    tool: ProfilerTool = Field(
        "torch",
        description="torch: torch.profiler (a Chrome trace); nsys: the rank's process runs under "
        "Nsight Systems with the cudaProfilerApi capture range (a .nsys-rep; CUDA only); "
        "viztracer: VizTracer's Python trace (a Chrome trace).",
    )
    start_step: PositiveInt = Field(le=MAX_ITERATIONS, description="First profiled step.")
    end_step: PositiveInt = Field(le=MAX_ITERATIONS, description="Last profiled step.")
    ranks: list[Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]] = Field(
        default=[0], max_length=64, description="Ranks to profile."
    )


class MegatronJobSpec(ApiModel):
    """Desired state of a MegatronJob."""

    image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Trainer container image. Unset: the platform's (a MegatronJobDefaults "
        "image, or the operator's trainer image, the chart's trainerImage).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the trainer container."
    )
    trainer: TrainerSpec | None = Field(
        None,
        description="Run your own training code per rank instead of the built-in trainer; "
        "model, training and data become optional (validated and written to the config file "
        "when given).",
    )
    model: ModelSpec | None = Field(
        None, description="The model (a recipe plus overrides); required without trainer."
    )
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="The parallel layout."
    )
    training: TrainingSpec | None = Field(
        None, description="Optimisation settings; required without trainer."
    )
    data: DataSpec | None = Field(None, description="Training data; required without trainer.")
    resources: ResourcesSpec = Field(description="Nodes, GPUs and per-pod resources.")
    topology: TopologySpec = Field(default_factory=TopologySpec, description="Pod packing.")
    checkpoint: CheckpointSpec = Field(description="Checkpoint volume and schedule.")
    restart_policy: RestartPolicySpec = Field(
        default_factory=RestartPolicySpec, description="Gang-restart and failure rules."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Extra trainer environment."
    )
    profiling: ProfilingSpec | None = Field(
        None, description="Optional profiler window (torch, nsys or viztracer)."
    )
    priority_class_name: DnsSubdomain | None = Field(None, description="PriorityClass of the pods.")
    suspend: bool = Field(False, description="true deletes the pods (they checkpoint first).")
    active_deadline_seconds: Seconds | None = Field(
        None,
        ge=1,
        description="Wall-clock limit, as SLURM's --time: the job fails with reason "
        "DeadlineExceeded (its pods stopped, checkpointing within their grace period) this long "
        "after status.startTime, whatever its restarts and suspensions. May change at any "
        "time." + _DAYS,
    )
    ttl_seconds_after_finished: Seconds | None = Field(
        None, description="Delete the job this long after it Succeeded or Failed." + _DAYS
    )
    template: PodTemplate | None = Field(
        None,
        description="The cluster's pod conventions, overlaid on every pod: labels, annotations, "
        "volumes, init containers and sidecars, image pull secrets, scheduling, DNS, security "
        "context, and extra env, envFrom, volume mounts and resources for the container named "
        "trainer. Lists merge by name; what the operator owns is refused.",
    )

    managed_by: str | None = Field(
        None,
        max_length=managedby.MAX_LENGTH,
        pattern=managedby.PATTERN,
        description=f"The controller that runs the job. Unset or {managedby.OPERATOR}: this "
        f"operator. {managedby.MULTIKUEUE}: Kueue's MultiKueue runs it on a worker cluster and "
        "mirrors its status here, where the operator creates only its Kueue Workload. Any other "
        "value: another controller, and this operator leaves the job alone. Immutable.",
    )

    @model_validator(mode="after")
    def _builtin_needs_sections(self) -> MegatronJobSpec:
        # Also CEL rules (cel.py). Raised as one error per missing field by the loader.
        if self.trainer is None:
            missing = [k for k in ("model", "training", "data") if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)} required: the built-in trainer needs them (or set "
                    "trainer.command to run your own code)"
                )
        return self
