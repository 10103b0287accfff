"""The layout rules as CEL (`x-kubernetes-validations`), so `kubectl apply` rejects bad specs.

These mirror `megatron_operator.core.planner` rule for rule; `tests/unit/test_rules.py` runs both over
the same table of valid and invalid specs. A recipe's defaults reach CEL as map literals generated
from `recipes.RECIPES`, so a spec that only names a recipe is still checked in full.

All rules sit on `spec` (so `self` is the spec) and name the offending field with `fieldPath`.
"""

from __future__ import annotations

from typing import Any, Final

from megatron_contract.bounds import MAX_NODES, MAX_WORLD_SIZE
from megatron_contract.env import OWNED as OWNED_ENV
from megatron_contract.env import OWNED_PREFIX as OWNED_ENV_PREFIX
from megatron_contract.paths import INIT_MOUNT
from megatron_contract.recipes import RECIPES
from megatron_contract.rules import LLAMA3_FIXED

from .base import (
    PARENT_SEGMENT_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUALIFIED_PREFIX_PATTERN,
)
from .podtypes import (
    ALLOWED_CAPABILITIES,
    SAFE_SYSCTLS,
    SELINUX_TYPES,
    WHY,
    AppArmorProfile,
    Capabilities,
    ContainerPort,
    HttpGetAction,
    PodAffinityTerm,
    PodSecurityContext,
    SeccompProfile,
    SecurityContext,
    SeLinuxOptions,
    Sysctl,
    TcpSocketAction,
    WindowsOptions,
)
from .podtypes import CROSS_NAMESPACE_WHY as _CROSS_NAMESPACE_WHY
from .spec import FABRIC_RESOURCES
from .template import (
    GPU_RESOURCES,
    GPU_WHY,
    LAUNCHER_INIT_CONTAINER,
    LAUNCHER_WHY,
    MOUNT_PATH_WHY,
    NOT_NORMAL_PATH_PATTERN,
    OWNED_ANNOTATION_PREFIXES,
    OWNED_ENV_WHY,
    OWNED_LABEL_PREFIXES,
    OWNED_MOUNT_PATHS,
    OWNED_MOUNT_WHY,
    OWNED_POD_FIELDS,
    OWNED_VOLUMES,
    TRAINER_ALLOWED,
    TRAINER_CONTAINER,
    Container,
    VolumeMount,
    container_field_why,
)
from .transitions import NEVER, SET_AT_CREATION, WHILE_SUSPENDED

S = "self"
M = "self.model"
P = "self.parallelism"
R = "self.resources"
T = "self.training"


def _lit(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


def _recipe_lookup(values: dict[str, str]) -> str:
    entries = ", ".join(f"{_lit(name)}: {expr}" for name, expr in values.items())
    return "{" + entries + "}[self.model.recipe]"


def model_field(name: str, fallback: str) -> str:
    """The effective value of model.<name>: explicit, else the recipe's, else `fallback`."""
    per_recipe = {r: _lit(v[name]) if name in v else fallback for r, v in RECIPES.items()}
    lookup = _recipe_lookup(per_recipe)
    return f"(has({M}.{name}) ? {M}.{name} : (has({M}.recipe) ? {lookup} : {fallback}))"


def moe_field(name: str, fallback: str) -> str:
    """The effective value of model.moe.<name>; `fallback` for dense recipes."""
    per_recipe = {
        r: _lit(v["moe"][name]) if name in v.get("moe", {}) else fallback
        for r, v in RECIPES.items()
    }
    lookup = _recipe_lookup(per_recipe)
    return (
        f"(has({M}.moe) && has({M}.moe.{name}) ? {M}.moe.{name} : "
        f"(has({M}.recipe) ? {lookup} : {fallback}))"
    )


def present(name: str) -> str:
    """model.<name> has a value (given or from the recipe); false without a spec.model."""
    return f"(has({S}.model) && (has({M}.{name}) || has({M}.recipe)))"


HEADS = model_field("numAttentionHeads", "1")
HIDDEN = model_field("hiddenSize", "1")
LAYERS = model_field("numLayers", "1")
SEQ = model_field("seqLength", "1")
GROUPS = model_field("numQueryGroups", HEADS)
FFN = model_field("ffnHiddenSize", f"4 * {HIDDEN}")
MAXPOS = model_field("maxPositionEmbeddings", SEQ)
EXPERTS = moe_field("numExperts", "0")
TOPK = moe_field("routerTopK", "0")
MOE_FFN = moe_field("ffnHiddenSize", FFN)
FIRST_DENSE = moe_field("firstKDenseLayers", "0")
HAS_MODEL = f"has({S}.model)"
HAS_TRAINING = f"has({S}.training)"
IS_MOE = f"({HAS_MODEL} && (has({M}.moe) || {EXPERTS} > 0))"
DISPATCHER = moe_field("tokenDispatcher", "'alltoall'")
POSITION = model_field("positionEmbedding", "'rope'")
IS_MLA = f"({HAS_MODEL} && (has({M}.mla) || (has({M}.recipe) && {_recipe_lookup({r: _lit('mla' in v) for r, v in RECIPES.items()})})))"
KV_EXPLICIT = f"(has({M}.kvChannels) || {model_field('kvChannels', '0')} > 0)"

TP, PP, CP, EP = f"{P}.tensor", f"{P}.pipeline", f"{P}.context", f"{P}.expert"
ETP = f"(has({P}.expertTensor) ? {P}.expertTensor : {P}.tensor)"
WORLD = f"({R}.nodes * {R}.procsPerNode)"
MP = f"({TP} * {PP} * {CP})"
MP_OK = f"({WORLD} % {MP} == 0)"
DP = f"({WORLD} / {MP})"
GPU = f"({R}.accelerator != 'none')"
NET_RESOURCE = (
    f"(has({R}.network.resourceName) ? {R}.network.resourceName : "
    f"{{{', '.join(f'{_lit(k)}: {_lit(v)}' for k, v in FABRIC_RESOURCES.items())}}}"
    f"[{R}.network.fabric])"
)
_I = f"{S}.checkpoint.init"
INIT_PATH = (
    f"(has({_I}.megatron) ? {_I}.megatron.path : "
    f"(has({_I}.huggingFace) ? {_I}.huggingFace.path : {_lit(INIT_MOUNT)}))"
)
MOCK = f"(has({S}.data.mock) && {S}.data.mock)"
NOT_INTERLEAVED = f"(!has({P}.virtualPipeline) || {P}.virtualPipeline == 1)"
# The effective sequenceParallel: explicit, else on with TP > 1 on GPUs
# (megatron_contract.rules.default_sequence_parallel).
SP = f"(has({P}.sequenceParallel) ? {P}.sequenceParallel : ({TP} > 1 && {GPU}))"
FSDP = f"(has({P}.fsdp) && {P}.fsdp)"
AUTO = f"(has({P}.auto) && {P}.auto)"
CKPT = f"{S}.checkpoint"


def rule(
    rule: str, message: str, field: str = "", reason: str = "FieldValueInvalid"
) -> dict[str, str]:
    """One x-kubernetes-validations entry. Messages are static: the apiserver's cost estimator
    prices `string(int)` in a messageExpression as an unbounded string and rejects the CRD. The
    planner (`mjob validate`) reports the same problems with the values and a suggested fix."""
    out = {"rule": rule, "message": message, "reason": reason}
    if field:
        out["fieldPath"] = field
    return out


SPEC_RULES: Final[list[dict[str, str]]] = [
    # --- bounds the schema cannot state alone (the per-field maxima are in the schema)
    rule(
        f"{WORLD} <= {MAX_WORLD_SIZE}",
        f"resources.nodes × resources.procsPerNode must be at most {MAX_WORLD_SIZE} ranks: "
        "use fewer nodes or processes per node",
        ".resources",
    ),
    rule(
        f"!has({R}.spareNodes) || {R}.nodes + {R}.spareNodes <= {MAX_NODES}",
        f"resources.nodes + resources.spareNodes must be at most {MAX_NODES} pods: use fewer "
        "spare nodes",
        ".resources",
    ),
    rule(
        f"!has({R}.spareNodes) || {R}.spareNodes == 0 || !has({S}.restartPolicy) || "
        f"!has({S}.restartPolicy.strategy) || {S}.restartPolicy.strategy == 'InPlace'",
        "spare nodes need restartPolicy.strategy InPlace: a lost node's rank moves onto a spare "
        "as an in-place restart; set the strategy to InPlace, or spareNodes to 0",
        ".resources.spareNodes",
    ),
    rule(
        f"!has({R}.spareNodes) || {R}.spareNodes == 0 || !has({S}.trainer) || "
        f"(has({S}.restartPolicy) && has({S}.restartPolicy.strategy) && "
        f"{S}.restartPolicy.strategy != 'InPlace')",
        "spare nodes need the in-place restart, which a trainer.command's ranks do not have: "
        "remove trainer.command, or set spareNodes to 0",
        ".resources.spareNodes",
    ),
    # --- required model fields when there is no recipe
    *[
        rule(
            f"!{HAS_MODEL} || has({M}.{f}) || has({M}.recipe)",
            f"model.{f} is required when model.recipe is not set: set it or choose a recipe",
            f".model.{f}",
            "FieldValueRequired",
        )
        for f in ("numLayers", "hiddenSize", "numAttentionHeads", "vocabSize", "seqLength")
    ],
    # --- the built-in trainer needs a model, training settings and data (trainer.command not)
    *[
        rule(
            f"has({S}.trainer) || has({S}.{f})",
            f"{f} is required: the built-in trainer needs it (or set trainer.command to run "
            "your own code)",
            f".{f}",
            "FieldValueRequired",
        )
        for f in ("model", "training", "data")
    ],
    # --- world, TP-in-node, data
    rule(
        f"{R}.procsPerNode % {TP} == 0",
        "parallelism.tensor must divide resources.procsPerNode, so that each tensor-parallel "
        "group stays inside one node",
        ".parallelism.tensor",
    ),
    rule(
        MP_OK,
        "tensor × pipeline × context must divide resources.nodes × resources.procsPerNode",
        ".parallelism",
    ),
    rule(
        f"!(type({P}.data) == int) || {P}.data * {MP} == {WORLD}",
        "data × tensor × pipeline × context must equal resources.nodes × "
        "resources.procsPerNode: set data to auto",
        ".parallelism.data",
    ),
    # --- tensor parallelism
    rule(
        f"!{present('numAttentionHeads')} || {HEADS} % {TP} == 0",
        "model.numAttentionHeads (or the recipe's) is not divisible by parallelism.tensor",
        ".parallelism.tensor",
    ),
    rule(
        f"!{present('numAttentionHeads')} || {HEADS} % {GROUPS} == 0",
        "model.numAttentionHeads must be a multiple of model.numQueryGroups",
        ".model.numQueryGroups",
    ),
    rule(
        f"!{present('numAttentionHeads')} || {HEADS} % {GROUPS} != 0 || "
        f"{GROUPS} % {TP} == 0 || {TP} % {GROUPS} == 0",
        "model.numQueryGroups and parallelism.tensor must divide one another",
        ".parallelism.tensor",
    ),
    rule(
        f"!{present('hiddenSize')} || {FFN} % {TP} == 0",
        "model.ffnHiddenSize (or the recipe's) is not divisible by parallelism.tensor",
        ".parallelism.tensor",
    ),
    rule(
        f"!{SP} || {TP} > 1",
        "sequenceParallel needs parallelism.tensor > 1",
        ".parallelism.sequenceParallel",
    ),
    rule(
        f"!{SP} || {TP} == 1 || !{present('seqLength')} || {SEQ} % {CP} != 0 || "
        f"({SEQ} / {CP}) % {TP} == 0",
        "sequence parallelism needs model.seqLength / parallelism.context divisible by "
        "parallelism.tensor",
        ".parallelism.sequenceParallel",
    ),
    rule(
        f"!{IS_MOE} || {TP} == 1 || {SP}",
        "MoE models with tensor parallelism need sequenceParallel: true",
        ".parallelism.sequenceParallel",
    ),
    # --- pipeline
    rule(
        f"!{present('numLayers')} || {LAYERS} % {PP} == 0",
        "model.numLayers (or the recipe's) is not divisible by parallelism.pipeline",
        ".parallelism.pipeline",
    ),
    rule(
        f"{NOT_INTERLEAVED} || {PP} > 1",
        "virtualPipeline > 1 needs parallelism.pipeline > 1",
        ".parallelism.virtualPipeline",
    ),
    rule(
        f"{NOT_INTERLEAVED} || {PP} == 1 || !{present('numLayers')} || "
        f"{LAYERS} % {PP} != 0 || {LAYERS} % ({PP} * {P}.virtualPipeline) == 0",
        "model.numLayers must split into pipeline × virtualPipeline equal stages",
        ".parallelism.virtualPipeline",
    ),
    # --- Megatron FSDP
    rule(
        f"!{FSDP} || {PP} == 1",
        "Megatron FSDP does not combine with pipeline parallelism: set pipeline: 1 or fsdp: false",
        ".parallelism.fsdp",
    ),
    # --- experts
    rule(
        f"!{HAS_MODEL} || {EP} == 1 || {IS_MOE}",
        "parallelism.expert > 1 needs an MoE model (model.moe)",
        ".parallelism.expert",
    ),
    rule(
        f"!{IS_MOE} || {EXPERTS} == 0 || {EXPERTS} % {EP} == 0",
        "model.moe.numExperts (or the recipe's) is not divisible by parallelism.expert",
        ".parallelism.expert",
    ),
    rule(
        f"!{IS_MOE} || {TOPK} <= {EXPERTS}",
        "model.moe.routerTopK exceeds model.moe.numExperts",
        ".model.moe.routerTopK",
    ),
    rule(
        f"!{IS_MOE} || !{present('hiddenSize')} || {MOE_FFN} % {ETP} == 0",
        "model.moe.ffnHiddenSize is not divisible by parallelism.expertTensor",
        ".parallelism.expertTensor",
    ),
    rule(
        f"!{IS_MOE} || !{present('numLayers')} || {FIRST_DENSE} < {LAYERS}",
        "model.moe.firstKDenseLayers must be below numLayers: an MoE model needs an MoE layer",
        ".model.moe.firstKDenseLayers",
    ),
    rule(
        f"(!{IS_MOE} && {EP} == 1) || {WORLD} % ({ETP} * {EP} * {PP}) == 0",
        "expertTensor × expert × pipeline must divide the world size (nodes × procsPerNode)",
        ".parallelism.expert",
    ),
    # --- sequence
    rule(
        f"{CP} == 1 || !{present('seqLength')} || {SEQ} % (2 * {CP}) == 0",
        "model.seqLength must be divisible by 2 × parallelism.context",
        ".parallelism.context",
    ),
    rule(
        f"!{present('hiddenSize')} || !{present('numAttentionHeads')} || {KV_EXPLICIT} || "
        f"{HIDDEN} % {HEADS} == 0",
        "model.hiddenSize is not divisible by model.numAttentionHeads: set model.kvChannels",
        ".model.hiddenSize",
    ),
    rule(
        f"!{present('seqLength')} || {MAXPOS} >= {SEQ}",
        "model.maxPositionEmbeddings is below model.seqLength",
        ".model.maxPositionEmbeddings",
    ),
    # --- platform
    rule(
        f"{GPU} || {CP} == 1",
        "context parallelism is CUDA-only: set context: 1 or resources.accelerator: nvidia.com/gpu",
        ".parallelism.context",
    ),
    rule(
        f"{GPU} || !{HAS_TRAINING} || !has({T}.precision) || {T}.precision == 'fp32'",
        "with resources.accelerator: none use training.precision: fp32",
        ".training.precision",
    ),
    rule(
        f"{GPU} || !{FSDP}",
        "Megatron FSDP is CUDA-only: set fsdp: false or resources.accelerator: nvidia.com/gpu",
        ".parallelism.fsdp",
    ),
    rule(
        f"{GPU} || !has({S}.profiling) || !has({S}.profiling.tool) || {S}.profiling.tool != 'nsys'",
        "nsys profiles CUDA: use profiling.tool torch or viztracer on CPU",
        ".profiling.tool",
    ),
    rule(
        f"{GPU} || !{SP}",
        "sequence parallelism needs Transformer Engine: turn it off with accelerator none",
        ".parallelism.sequenceParallel",
    ),
    rule(
        f"{GPU} || !{IS_MOE} || {DISPATCHER} == 'allgather'",
        "the alltoall MoE dispatcher is CUDA-only: use tokenDispatcher: allgather on CPU",
        ".model.moe.tokenDispatcher",
    ),
    rule(
        f"!{IS_MLA} || {POSITION} == 'rope'",
        "multi-latent attention (model.mla) needs positionEmbedding: rope",
        ".model.positionEmbedding",
    ),
    # --- RoPE scaling (the spec's own: no recipe sets it)
    rule(
        f"!{HAS_MODEL} || !has({M}.ropeScaling) || {M}.ropeScaling.type != 'yarn'",
        "ropeScaling yarn (DeepSeek-V2's long-context extension) is not implemented by this "
        "trainer: pre-train with plain RoPE, or use llama3",
        ".model.ropeScaling.type",
    ),
    rule(
        f"!{HAS_MODEL} || !has({M}.ropeScaling) || {M}.ropeScaling.type == 'yarn' || "
        f"({POSITION} == 'rope' && !{IS_MLA})",
        "llama3 RoPE scaling applies to standard attention with positionEmbedding rope",
        ".model.ropeScaling",
    ),
    *[
        rule(
            f"!{HAS_MODEL} || !has({M}.ropeScaling) || {M}.ropeScaling.type == 'yarn' || "
            f"!has({M}.ropeScaling.{key}) || {M}.ropeScaling.{key} == {_lit(value)}",
            f"Megatron-Core's llama3 RoPE scaling fixes {key} at {value:g}",
            f".model.ropeScaling.{key}",
        )
        for key, value in LLAMA3_FIXED.items()
    ],
    # --- batch and schedule
    rule(
        f"!{HAS_TRAINING} || !{MP_OK} || {T}.globalBatchSize % ({T}.microBatchSize * {DP}) == 0",
        "training.globalBatchSize must be a multiple of microBatchSize × data",
        ".training.globalBatchSize",
    ),
    rule(
        f"!{HAS_TRAINING} || {NOT_INTERLEAVED} || {PP} == 1 || !{MP_OK} || "
        f"{T}.globalBatchSize % ({T}.microBatchSize * {DP}) != 0 || "
        f"({T}.globalBatchSize / ({T}.microBatchSize * {DP})) % {PP} == 0",
        "the interleaved schedule needs the number of microbatches to be a multiple of pipeline",
        ".training.globalBatchSize",
    ),
    rule(f"!{HAS_TRAINING} || {T}.minLr <= {T}.lr", "minLr exceeds lr", ".training.minLr"),
    rule(
        f"!{HAS_TRAINING} || {T}.warmupIters < {T}.trainIters",
        "warmupIters must be below trainIters",
        ".training.warmupIters",
    ),
    rule(
        f"!has({S}.profiling) || {S}.profiling.startStep <= {S}.profiling.endStep",
        "endStep must not be before startStep",
        ".profiling.endStep",
    ),
    rule(
        f"!has({S}.profiling) || !{HAS_TRAINING} || {S}.profiling.startStep <= {T}.trainIters",
        "profiling.startStep is after training.trainIters",
        ".profiling.startStep",
    ),
    rule(
        f"!has({S}.profiling) || !has({S}.profiling.ranks) || "
        f"{S}.profiling.ranks.all(r, r < {WORLD})",
        "profiling.ranks must be below the world size",
        ".profiling.ranks",
    ),
    # --- objects
    rule(
        f"!has({S}.data) || ({MOCK} != has({S}.data.blend)) || "
        f"(has({S}.trainer) && !{MOCK} && !has({S}.data.blend))",
        "set exactly one of data.mock: true or data.blend (with trainer.command: at most one)",
        ".data",
    ),
    rule(
        f"!has({S}.data) || !has({S}.data.blend) || has({S}.data.tokenizer)",
        "data.blend needs data.tokenizer.path",
        ".data.tokenizer",
    ),
    rule(
        f"{S}.topology.mode == 'none' || has({S}.topology.key)",
        "topology.mode required or preferred needs topology.key",
        ".topology.key",
    ),
    rule(
        f"has({CKPT}.volume) != has({CKPT}.url)",
        "set exactly one of checkpoint.volume or checkpoint.url",
        ".checkpoint",
    ),
    rule(
        f"!has({CKPT}.volume) || has({CKPT}.volume.claimName) != has({CKPT}.volume.create)",
        "set exactly one of volume.claimName or volume.create",
        ".checkpoint.volume",
    ),
    rule(
        f"!has({CKPT}.url) || has({CKPT}.msc)",
        "checkpoint.url needs the MSC config: name its Secret in checkpoint.msc.configSecret",
        ".checkpoint.msc.configSecret",
        "FieldValueRequired",
    ),
    rule(
        f"has({CKPT}.url) || !has({CKPT}.msc)",
        "checkpoint.msc is only used with checkpoint.url: remove it",
        ".checkpoint.msc",
    ),
    rule(
        f"!{FSDP} || !has({CKPT}.init) || !has({CKPT}.init.megatron) || "
        f"!has({CKPT}.init.megatron.load) || {CKPT}.init.megatron.load != 'full'",
        "Megatron FSDP cannot take a torch_dist checkpoint's optimizer state: use load: weights, "
        "or fsdp: false",
        ".checkpoint.init.megatron.load",
    ),
    rule(
        f"!{FSDP} || !has({CKPT}.url)",
        "Megatron FSDP saves fsdp_dtensor checkpoints to a file system: use checkpoint.volume, "
        "or fsdp: false",
        ".checkpoint.url",
    ),
    rule(
        f"!has({CKPT}.url) || !has({CKPT}.path)",
        "with checkpoint.url put the directory in the URL instead of checkpoint.path",
        ".checkpoint.path",
    ),
    rule(
        f"!{AUTO} || ({TP} == 1 && {PP} == 1 && !has({P}.virtualPipeline) && {CP} == 1 && "
        f"{EP} == 1 && !has({P}.expertTensor) && type({P}.data) == string && !{FSDP})",
        "with parallelism.auto the operator chooses the degrees: leave them and fsdp unset",
        ".parallelism.auto",
    ),
    rule(
        f"!{AUTO} || ({HAS_MODEL} && {HAS_TRAINING})",
        "parallelism.auto needs spec.model and spec.training to choose a layout: set them, or "
        "give the degrees (tensor, pipeline, ...) yourself",
        ".parallelism.auto",
    ),
    rule(
        f"!{AUTO} || {CKPT}.shardingType == 'fully_reshardable'",
        "parallelism.auto may change tensor or pipeline on a resize: set checkpoint.shardingType: "
        "fully_reshardable so the checkpoints reshard to the new layout",
        ".checkpoint.shardingType",
    ),
    rule(
        f"!has({CKPT}.volume) || !has({CKPT}.volume.create) || "
        f"{R}.nodes + (has({R}.spareNodes) ? {R}.spareNodes : 0) == 1 || "
        f"'ReadWriteMany' in {CKPT}.volume.create.accessModes",
        "several nodes (spares included) mount the checkpoint volume: include ReadWriteMany",
        ".checkpoint.volume.create.accessModes",
    ),
    rule(
        f"!has({S}.checkpoint.init) || "
        f"has({S}.checkpoint.init.megatron) != has({S}.checkpoint.init.huggingFace)",
        "set exactly one of checkpoint.init.megatron or checkpoint.init.huggingFace",
        ".checkpoint.init",
    ),
    rule(
        f"{S}.restartPolicy.maxBackoffSeconds >= {S}.restartPolicy.backoffSeconds",
        "maxBackoffSeconds is below backoffSeconds",
        ".restartPolicy.maxBackoffSeconds",
    ),
    rule(
        f"!{GPU} || !has({R}.requests) || !({R}.accelerator in {R}.requests)",
        "the GPU request is set from procsPerNode: remove it from resources.requests",
        ".resources.requests",
    ),
    rule(
        f"!has({R}.requests) || {R}.requests.all(k, "
        f"!((k.contains('/') && !k.contains('kubernetes.io/')) || k.startsWith('hugepages-')) "
        f"|| k == {R}.accelerator || (has({R}.limits) && k in {R}.limits))",
        "an extended resource or huge pages request needs its limit (they are not "
        "overcommitted): set resources.limits to the same amount, or give only the limit",
        ".resources.requests",
    ),
    # Three named resources keep the rule's cost within the apiserver's budget (a loop over
    # the maps with quantity() is 8x over it); the model checks every resource, and the
    # extended ones' request == limit rule.
    rule(
        f"!has({R}.requests) || !has({R}.limits) || ['cpu', 'memory', 'ephemeral-storage']"
        f".all(k, !(k in {R}.requests) || !(k in {R}.limits) || "
        f"quantity(string({R}.requests[k])).compareTo(quantity(string({R}.limits[k]))) <= 0)",
        "a resource request is above its limit: a pod may not request more than its limit; "
        "raise the limit or lower the request",
        ".resources.requests",
    ),
    rule(
        f"!{GPU} || !has({R}.limits) || !({R}.accelerator in {R}.limits)",
        "the GPU limit is set from procsPerNode: remove it from resources.limits",
        ".resources.limits",
    ),
    # --- the network fabric's devices are set from resources.network
    rule(
        f"!has({R}.network) || {R}.network.fabric != 'none' || !has({R}.network.resourceName)",
        "resources.network.resourceName needs a fabric: set resources.network.fabric",
        ".resources.network.resourceName",
    ),
    *[
        rule(
            f"!has({R}.network) || {R}.network.fabric == 'none' || !has({R}.{kind}) || "
            f"!({NET_RESOURCE} in {R}.{kind})",
            f"the network devices are set from resources.network.devices: remove them from "
            f"resources.{kind}",
            f".resources.{kind}",
        )
        for kind in ("requests", "limits")
    ],
    # --- where the weights to start from are
    rule(
        f"!has({S}.checkpoint.init) || !has({S}.checkpoint.init.volume) || "
        f"({INIT_PATH} + '/').startsWith({_lit(INIT_MOUNT + '/')})",
        f"with checkpoint.init.volume, the path to start from must be under {INIT_MOUNT}, "
        "where that volume is mounted",
        ".checkpoint.init",
    ),
]

# Rules attached to other schema nodes: {path of the node: rules}. Paths use camelCase names.
NODE_RULES: Final[dict[str, list[dict[str, str]]]] = {
    "spec.restartPolicy.rules[]": [
        rule(
            "has(self.exitCodes) || has(self.reasons)",
            "a rule needs exitCodes, reasons or both",
            reason="FieldValueRequired",
        )
    ],
    "spec.parallelism.data": [
        rule(
            "type(self) == int ? self >= 1 : self == 'auto'",
            "data must be auto or a positive integer",
        )
    ],
    **{
        f"spec.resources.{kind}": [
            rule(
                "self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || "
                "k.startsWith('hugepages-') || k.contains('/'))",
                "not a Kubernetes resource name: use cpu, memory, ephemeral-storage, "
                "hugepages-<size>, or a qualified name like rdma/ib",
            )
        ]
        for kind in ("requests", "limits")
    },
    "spec.resources.nodeSelector": [
        rule(
            f"self.all(k, k.matches({_lit(QUALIFIED_NAME_PATTERN)}) && "
            f"k.matches({_lit(QUALIFIED_PREFIX_PATTERN)}))",
            "every key must be a label key: an optional DNS prefix and '/', then at most 63 "
            "letters, digits, '-', '_' or '.' (e.g. example.com/pool)",
        )
    ],
    **{
        path: [
            rule(
                f"self.matches({_lit(QUALIFIED_PREFIX_PATTERN)})",
                "the prefix before '/' must be at most 253 characters",
            )
        ]
        for path in ("spec.topology.key", "spec.resources.tolerations[].key")
    },
    **{
        path: [
            rule(
                f"!self.matches({_lit(PARENT_SEGMENT_PATTERN)})",
                "the path must not have a '.' or '..' segment: give it without them",
            )
        ]
        for path in (
            "spec.data.blend[].prefix",
            "spec.data.tokenizer.path",
            "spec.checkpoint.init.megatron.path",
            "spec.checkpoint.url",
            "spec.checkpoint.init.huggingFace.path",
        )
    },
    "spec.env[]": [
        rule(
            "!(self.name in [" + ", ".join(_lit(n) for n in sorted(OWNED_ENV)) + "])",
            "this name is set by the operator (MASTER_ADDR, WORLD_SIZE, …): remove it from spec.env",
            ".name",
        )
    ],
}


def _list(values: Any) -> str:
    return "[" + ", ".join(_lit(v) for v in values) + "]"


def _label_keys(prefixes: tuple[str, ...], what: str) -> list[dict[str, str]]:
    refused = " || ".join(f"k.startsWith({_lit(p)})" for p in prefixes)
    return [
        rule(
            f"self.all(k, k.matches({_lit(QUALIFIED_NAME_PATTERN)}) && "
            f"k.matches({_lit(QUALIFIED_PREFIX_PATTERN)}))",
            f"every {what} key must be a qualified name: an optional DNS prefix and '/', then "
            "at most 63 letters, digits, '-', '_' or '.'",
        ),
        rule(
            f"!self.exists(k, {refused})",
            f"{' and '.join(prefixes)} {what} keys are set by the operator",
        ),
    ]


_TRAINER = f"(self.name != {_lit(TRAINER_CONTAINER)})"  # true for any other container
_CONTAINER_FIELDS = [
    f.alias or n for n, f in Container.model_fields.items() if (f.alias or n) not in TRAINER_ALLOWED
]
_OWNED_MOUNT = (
    f"m.name in {_list(OWNED_VOLUMES)} || "
    f"{_list(OWNED_MOUNT_PATHS)}.exists(p, (m.mountPath + '/').startsWith(p + '/'))"
)
_ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
_ENV_ITEM_RULES = [
    rule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both"),
]
_ENV_SOURCE_RULES = [
    rule(
        " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in _ENV_SOURCES) + " == 1",
        "set exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef",
    )
]

# spec.template (api/template.py): the same refusals, in the same words.
TEMPLATE_RULES: Final[dict[str, list[dict[str, str]]]] = {
    "spec.template.metadata.labels": _label_keys(OWNED_LABEL_PREFIXES, "label"),
    "spec.template.metadata.annotations": _label_keys(OWNED_ANNOTATION_PREFIXES, "annotation"),
    "spec.template.spec": [
        rule(f"!has(self.{name})", f"set by the operator: {why}", f".{name}", "FieldValueForbidden")
        for name, why in OWNED_POD_FIELDS.items()
    ]
    + [
        rule(
            "!has(self.initContainers) || !has(self.containers) || "
            "!self.initContainers.exists(i, self.containers.exists(c, c.name == i.name))",
            "a container name may appear once across initContainers and containers",
            ".initContainers",
            "FieldValueDuplicate",
        )
    ],
    "spec.template.spec.volumes[]": [
        rule(
            f"!(self.name in {_list(OWNED_VOLUMES)})",
            "this is one of the operator's volumes ("
            + ", ".join(f"{k}: {v}" for k, v in OWNED_VOLUMES.items())
            + "): choose another name",
            ".name",
            "FieldValueForbidden",
        )
    ],
    "spec.template.spec.initContainers[]": [
        rule(
            f"{_TRAINER}",
            f"{TRAINER_CONTAINER!r} is the trainer container: it runs in containers",
            ".name",
            "FieldValueForbidden",
        ),
        rule(
            f"self.name != {_lit(LAUNCHER_INIT_CONTAINER)}",
            LAUNCHER_WHY,
            ".name",
            "FieldValueForbidden",
        ),
        rule("has(self.image)", "an init container needs an image", ".image", "FieldValueRequired"),
    ],
    "spec.template.spec.containers[]": [
        rule(
            f"self.name == {_lit(TRAINER_CONTAINER)} || has(self.image)",
            "a sidecar container needs an image",
            ".image",
            "FieldValueRequired",
        ),
        *[
            rule(
                f"{_TRAINER} || !has(self.{name})",
                f"the trainer container: {container_field_why(name)}",
                f".{name}",
                "FieldValueForbidden",
            )
            for name in _CONTAINER_FIELDS
        ],
        rule(
            f"{_TRAINER} || !has(self.env) || self.env.all(e, !(e.name in {_list(sorted(OWNED_ENV))})"
            f" && !e.name.startsWith({_lit(OWNED_ENV_PREFIX)}))",
            f"the trainer container: {OWNED_ENV_WHY}",
            ".env",
            "FieldValueForbidden",
        ),
        rule(
            f"{_TRAINER} || !has(self.volumeMounts) || !self.volumeMounts.exists(m, {_OWNED_MOUNT})",
            f"the trainer container: {OWNED_MOUNT_WHY}",
            ".volumeMounts",
            "FieldValueForbidden",
        ),
        rule(
            f"{_TRAINER} || !has(self.volumeMounts) || "
            f"!self.volumeMounts.exists(m, m.mountPath.matches({_lit(NOT_NORMAL_PATH_PATTERN)}))",
            f"the trainer container: {MOUNT_PATH_WHY}",
            ".volumeMounts",
            "FieldValueInvalid",
        ),
        *[
            rule(
                f"{_TRAINER} || !has(self.resources) || !has(self.resources.{kind}) || "
                f"!self.resources.{kind}.exists(k, k in {_list(GPU_RESOURCES)})",
                f"the trainer container: {GPU_WHY}",
                f".resources.{kind}",
                "FieldValueForbidden",
            )
            for kind in ("requests", "limits")
        ],
    ],
    "spec.template.spec.containers[].env[]": _ENV_ITEM_RULES,
    "spec.template.spec.initContainers[].env[]": _ENV_ITEM_RULES,
    "spec.template.spec.containers[].env[].valueFrom": _ENV_SOURCE_RULES,
    "spec.template.spec.initContainers[].env[].valueFrom": _ENV_SOURCE_RULES,
    "spec.template.spec.nodeSelector": NODE_RULES["spec.resources.nodeSelector"],
    "spec.template.spec.tolerations[].key": NODE_RULES["spec.topology.key"],
}


def _forbid(expr: str, why: str, field: str) -> dict[str, str]:
    return rule(expr, WHY[why], field, "FieldValueForbidden")


def _off(name: str) -> str:
    return f"!has(self.{name}) || !self.{name}"


# Rules of a Kubernetes type wherever it appears under spec (crd.py finds each place from the
# models): the restricted Pod Security level for every container and the pod, no host in a
# probe or hook, no pod affinity term over other namespaces. The models refuse the same, in the
# same words (api/podtypes.py).
TYPE_RULES: Final[dict[type, list[dict[str, str]]]] = {
    SecurityContext: [
        _forbid(_off("privileged"), "privileged", ".privileged"),
        _forbid(
            _off("allowPrivilegeEscalation"),
            "allowPrivilegeEscalation",
            ".allowPrivilegeEscalation",
        ),
        _forbid("!has(self.runAsUser) || self.runAsUser != 0", "runAsUser", ".runAsUser"),
        _forbid("!has(self.runAsNonRoot) || self.runAsNonRoot", "runAsNonRoot", ".runAsNonRoot"),
        _forbid("!has(self.procMount) || self.procMount != 'Unmasked'", "procMount", ".procMount"),
    ],
    PodSecurityContext: [
        _forbid("!has(self.runAsUser) || self.runAsUser != 0", "runAsUser", ".runAsUser"),
        _forbid("!has(self.runAsNonRoot) || self.runAsNonRoot", "runAsNonRoot", ".runAsNonRoot"),
    ],
    Capabilities: [
        _forbid(
            f"!has(self.add) || self.add.all(c, c in {_list(ALLOWED_CAPABILITIES)})",
            "capabilities",
            ".add",
        )
    ],
    SeccompProfile: [_forbid("self.type != 'Unconfined'", "seccompProfile", ".type")],
    AppArmorProfile: [_forbid("self.type != 'Unconfined'", "appArmorProfile", ".type")],
    SeLinuxOptions: [
        _forbid(
            "(!has(self.user) || self.user == '') && (!has(self.role) || self.role == '') && "
            f"(!has(self.type) || self.type in {_list(SELINUX_TYPES)})",
            "seLinuxOptions",
            "",
        )
    ],
    WindowsOptions: [_forbid(_off("hostProcess"), "hostProcess", ".hostProcess")],
    Sysctl: [_forbid(f"self.name in {_list(SAFE_SYSCTLS)}", "sysctls", ".name")],
    ContainerPort: [
        _forbid(
            "(!has(self.hostPort) || self.hostPort == 0) && (!has(self.hostIP) || self.hostIP == '')",
            "hostPort",
            ".hostPort",
        )
    ],
    VolumeMount: [
        _forbid(
            "!has(self.mountPropagation) || self.mountPropagation != 'Bidirectional'",
            "mountPropagation",
            ".mountPropagation",
        )
    ],
    HttpGetAction: [_forbid("!has(self.host) || self.host == ''", "host", ".host")],
    TcpSocketAction: [_forbid("!has(self.host) || self.host == ''", "host", ".host")],
    PodAffinityTerm: [
        rule(f"!has(self.{f})", _CROSS_NAMESPACE_WHY, f".{f}", "FieldValueForbidden")
        for f in ("namespaces", "namespaceSelector")
    ],
}

# Which fields may change on an existing job: the lists live in transitions.py (the Python
# check the operator runs); here they become CEL transition rules.


def _same(path: str, prefix: str = "") -> str:
    """CEL: the optional field at `path` is equal in self and oldSelf (both absent counts). Each
    optional parent is checked first, so a missing parent (e.g. no spec.training with a
    trainer.command) is never dereferenced."""
    head, _, rest = path.partition(".")
    here = f"{prefix}.{head}" if prefix else head
    new, old = f"self.{here}", f"oldSelf.{here}"
    parent_new = f"self.{prefix}" if prefix else "self"
    parent_old = f"oldSelf.{prefix}" if prefix else "oldSelf"
    present = f"has({parent_new}.{head}) == has({parent_old}.{head})"
    inner = f"{new} == {old}" if not rest else _same(rest, here)
    return f"({present} && (!has({parent_new}.{head}) || {inner}))"


_WHILE_SUSPENDED = " && ".join(_same(p) for p in WHILE_SUSPENDED)

TRANSITION_RULES: Final[list[dict[str, str]]] = [
    rule(
        " && ".join(_same(p) for p in NEVER),
        "spec.model, training.globalBatchSize, checkpoint.volume, checkpoint.path and "
        "checkpoint.url are immutable: checkpoints and the data order depend on them",
    ),
    rule(
        " && ".join(_same(p) for p in SET_AT_CREATION),
        "spec.managedBy is immutable: it names the controller that runs the job",
    ),
    rule(
        f"(oldSelf.suspend && self.suspend) || ({_WHILE_SUSPENDED})",
        "the layout, resources, placement, data, image and training settings (except "
        "trainIters) change only while the job is suspended: set spec.suspend: true first",
    ),
]
