"""`MegatronJob.status`: written only by the operator (status subresource)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from megatron_contract import tiers

from .base import ApiModel
from .defaults import AppliedDefaults


class Phase(StrEnum):
    """Where a job is in its life (status.phase)."""

    PENDING = "Pending"  # pods being created or scheduled
    QUEUED = "Queued"  # waiting for a queue's admission (Kueue)
    RUNNING = "Running"  # every pod of the current attempt runs
    RESTARTING = "Restarting"  # a rank failed: old pods going away, then the backoff
    SUCCEEDED = "Succeeded"  # every pod exited 0
    FAILED = "Failed"  # the failure rules, maxRestarts or an invalid spec ended it
    SUSPENDED = "Suspended"  # spec.suspend: no pods


class Rung(StrEnum):
    """How a restart recovers (status.lastFailure.rung): the lowest rung that can."""

    IN_PLACE = "InPlace"  # every rank restarted inside the running pods
    REPLACE_POD = "ReplacePod"  # the lost pods recreated, the others' ranks restarted in place
    # A lost pod's node rank moved onto a warm spare; every rank restarted in place, no pod made
    SPARE_SWAP = "SpareSwap"
    RECREATE = "Recreate"  # every pod recreated


class Cause(StrEnum):
    """Where a second of a job's wall time went (status.ledger.seconds; the metric
    megatronjob_goodput_seconds_total{cause}). docs/metrics.md defines each one exactly."""

    QUEUED = "queued"  # waiting for Kueue's admission, or for the operator's first look
    SCHEDULING = "scheduling"  # the attempt's pods created and waiting for nodes
    START_UP = "startUp"  # image pull, container start, imports, model build
    RENDEZVOUS = "rendezvous"  # the ranks forming their process groups
    CHECKPOINT_LOAD = "checkpointLoad"  # loading the checkpoint (or the initial weights)
    CHECKPOINT_SAVE = "checkpointSave"  # the training loop blocked by a checkpoint save
    RECOMPUTED = "recomputed"  # steps trained again after a restart, and work lost in flight
    RESTART_IN_PLACE = "restartInPlace"  # from a failure to its restart's release, per rung
    RESTART_REPLACE_POD = "restartReplacePod"
    RESTART_SPARE_SWAP = "restartSpareSwap"
    RESTART_RECREATE = "restartRecreate"
    HANG_DETECTION = "hangDetection"  # from the last sign of life to the Hang restart
    SUSPENDED = "suspended"  # spec.suspend, or evicted back into the queue
    PRODUCTIVE = "productive"  # training steps reached for the first time
    FINISHING = "finishing"  # from the last record to the job's end (final save, exit)
    NOT_REPORTED = "notReported"  # inside the trainer's process, not broken down by the code
    UNATTRIBUTED = "unattributed"  # no fact yet says where it went


RESTART_CAUSES: dict[Rung, Cause] = {
    Rung.IN_PLACE: Cause.RESTART_IN_PLACE,
    Rung.REPLACE_POD: Cause.RESTART_REPLACE_POD,
    Rung.SPARE_SWAP: Cause.RESTART_SPARE_SWAP,
    Rung.RECREATE: Cause.RESTART_RECREATE,
}


class ConditionType(StrEnum):
    """The conditions the operator keeps in status.conditions."""

    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PODS_SCHEDULED = "PodsScheduled"
    # True while the apiserver refuses the job's objects (RBAC, Pod Security, a ResourceQuota),
    # as a Deployment's ReplicaFailure: the message is the apiserver's own.
    CREATE_FAILURE = "CreateFailure"
    CHILDREN_OWNED = "ChildrenOwned"  # False: an object with a child's name is someone else's
    ADMITTED = "Admitted"  # Kueue admitted the job's Workload (queued jobs only)
    # False while a pod of the attempt cannot start: an image that cannot be pulled, a missing
    # Secret or ConfigMap, a container the runtime cannot create, or long unschedulable; the
    # reason is the kubelet's or the scheduler's, the message names the pod and quotes it.
    PODS_STARTED = "PodsStarted"


class Reason(StrEnum):
    """Reasons on conditions and events (failure reasons are `FailureReason`)."""

    CREATED = "Created"
    INVALID_SPEC = "InvalidSpec"
    SPEC_FIXED = "SpecFixed"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    ALL_PODS_RUNNING = "AllPodsRunning"
    PODS_NOT_RUNNING = "PodsNotRunning"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    RESTARTED = "Restarted"
    COMPLETED = "Completed"
    MAX_RESTARTS_EXCEEDED = "MaxRestartsExceeded"
    FAILURE_POLICY = "FailurePolicy"
    UNSCHEDULABLE = "Unschedulable"
    ALL_PODS_SCHEDULED = "AllPodsScheduled"
    FAILED_CREATE = "FailedCreate"
    CHILD_CONFLICT = "ChildConflict"  # an object with a child's name is not controlled by the job
    CHILDREN_CREATED = "ChildrenCreated"  # the conflict is gone: every child is the job's own
    BAD_JOB_DATA = "BadJobData"  # the job's status or numbers cannot be processed
    QUEUED = "Queued"  # waiting for Kueue's admission (the message is Kueue's own)
    ADMITTED = "Admitted"
    EVICTED = "Evicted"  # Kueue took the quota back (preemption, deactivation, ...)
    ADMISSION_CONFLICT = "AdmissionConflict"  # the admitted flavor contradicts the job's pods
    FORCE_DELETED = "ForceDeleted"  # a pod on a lost node, whose kubelet cannot finish its delete
    SPARE_LOST = "SpareLost"  # a spare pod failed or its node went: it is made again
    COORDINATOR_MOVED = "CoordinatorMoved"  # the launchers' coordinator moved off node rank 0
    ALL_PODS_STARTED = "AllPodsStarted"
    STARTING = "Starting"  # no pod reports a problem; not all are Running yet
    ATTEMPT_FAILED = "AttemptFailed"  # one event per failed attempt, naming every failed rank
    DEADLINE_EXCEEDED = "DeadlineExceeded"  # spec.activeDeadlineSeconds passed
    # A queue label while the operator runs without Kueue: held, never run outside the quota.
    QUEUE_UNAVAILABLE = "KueueDisabled"
    NO_QUEUE = "QueueLabelRequired"  # the operator requires a queue label (--require-queue)


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


PHASES: tuple[Phase, ...] = tuple(Phase)


class Condition(ApiModel):
    """A condition in the Kubernetes convention."""

    type: str = Field(description="Condition type, e.g. Running, Restarting, Succeeded, Failed.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase machine-readable reason.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="Spec generation this reflects.")


class FailureRecord(ApiModel):
    """The failure that caused the latest restart or the final failure."""

    pod: str | None = Field(None, description="Pod that failed first.")
    node: str | None = Field(None, description="Node it ran on.")
    exit_code: int | None = Field(None, description="Trainer exit code, when it exited.")
    reason: str = Field(description="Failure reason (see spec.restartPolicy.rules).")
    message: str = Field("", description="Detail from the pod or the operator.")
    action: str = Field(description="What the failure rules decided.")
    rung: Rung | None = Field(
        None,
        description="How the restart recovers: InPlace, SpareSwap, ReplacePod or Recreate.",
    )
    rung_reason: str | None = Field(
        None, description="Why that rung, when it is not the lowest one (e.g. a node failed twice)."
    )
    time: str = Field(description="When the operator saw it (RFC 3339).")


class Progress(ApiModel):
    """Latest progress reported by trainer rank 0 (the job's progress Lease, `<job>-progress`)."""

    attempt: int | None = Field(None, description="The restart attempt that reported it.")
    iteration: int = Field(description="Last completed optimizer step.")
    loss: float | None = Field(None, description="Training loss at that step.")
    tokens_per_second: float | None = Field(None, description="Training throughput.")
    mfu: float | None = Field(None, description="Model FLOPs utilisation (0–1).")
    checkpoint_iteration: int | None = Field(None, description="Newest complete checkpoint.")
    time: str = Field(description="When rank 0 reported it (RFC 3339).")


class Tier(StrEnum):
    """A checkpoint tier (megatron_contract/tiers.py)."""

    MEMORY = tiers.MEMORY
    PEER = tiers.PEER
    DURABLE = tiers.DURABLE
    NONE = tiers.NONE


class Restore(ApiModel):
    """Where one attempt's ranks restored their training state from (docs/runbook.md,
    "Checkpoint tiers")."""

    attempt: int = Field(ge=0, description="The restart attempt.")
    tier: Tier = Field(
        description="Memory: every pod's own memory; Peer: a copy in another pod's memory for "
        "the ranks of a replaced pod, their own for the rest; Durable: the torch_dist "
        "checkpoint; None: nothing to restore (a fresh start)."
    )
    step: int | None = Field(None, ge=0, description="The step restored.")


_SECONDS = Field(None, ge=0, description="Seconds.")


class LedgerSeconds(ApiModel):
    """The job's wall time by cause, in seconds (docs/metrics.md defines each cause)."""

    queued: float | None = _SECONDS
    scheduling: float | None = _SECONDS
    start_up: float | None = _SECONDS
    rendezvous: float | None = _SECONDS
    checkpoint_load: float | None = _SECONDS
    checkpoint_save: float | None = _SECONDS
    recomputed: float | None = _SECONDS
    restart_in_place: float | None = _SECONDS
    restart_replace_pod: float | None = _SECONDS
    restart_spare_swap: float | None = _SECONDS
    restart_recreate: float | None = _SECONDS
    hang_detection: float | None = _SECONDS
    suspended: float | None = _SECONDS
    productive: float | None = _SECONDS
    finishing: float | None = _SECONDS
    not_reported: float | None = _SECONDS
    unattributed: float | None = _SECONDS


class RungCost(ApiModel):
    """What the restarts of one rung cost: from each failure to its next attempt's first step."""

    rung: Rung = Field(description="InPlace, SpareSwap, ReplacePod or Recreate.")
    count: int = Field(ge=0, description="Restarts of this rung.")
    seconds: float = Field(
        ge=0, description="Their recovery seconds in all (the attempt running when counted)."
    )


class LedgerInFlight(ApiModel):
    """The work a failure interrupted, counted as recomputed up to the failure from the last
    record the operator had seen: a later record of that attempt (its rank 0 reports the steps
    it finished before the failure as it exits) moves the time of those steps back."""

    attempt: int = Field(ge=0, description="The attempt that failed.")
    start: float = Field(ge=0, description="Seconds: the interval's start (the last record seen).")
    end: float = Field(ge=0, description="Seconds: the failure.")
    iteration: int = Field(ge=0, description="The step the interval began after.")
    save_seen: float = Field(ge=0, description="Save seconds of the attempt already counted.")


class LedgerFold(ApiModel):
    """Where the operator's fold over the job's facts stands, so that the next operator (or the
    next reconcile) continues it. Offsets are seconds since status.ledger.since."""

    mode: str = Field(description="What the job is doing as the ledger last saw it.")
    attempt: int = Field(ge=0, description="The attempt the ledger follows.")
    rung: Rung | None = Field(None, description="The rung of the restart in progress.")
    closed: float = Field(ge=0, description="Seconds attributed to causes so far.")
    last_iteration: int = Field(ge=0, description="The step the open training interval began.")
    save_seen: float = Field(ge=0, description="Save seconds of the attempt already counted.")
    high: int = Field(ge=0, description="The highest step ever completed.")
    failed_at: float | None = Field(
        None, ge=0, description="The failure whose recovery is being measured."
    )
    trained_steps: int = Field(ge=0, description="Steps whose time the ledger measured.")
    step_seconds: float | None = Field(None, ge=0, description="Recent seconds per step.")
    record_seconds: float | None = Field(
        None, ge=0, description="Recent seconds between the trainer's records it folded."
    )
    in_flight: LedgerInFlight | None = Field(
        None, description="The work the last failure interrupted, until the next attempt trains."
    )
    stopped: LedgerInFlight | None = Field(
        None,
        description=(
            "A training attempt stopped by a suspend or a requeue, counted to that cause from "
            "the decision (end: the decision); its final record moves the steps it finished "
            "and the checkpoint it saved while stopping back."
        ),
    )


class Ledger(ApiModel):
    """The goodput ledger: the job's wall time split by cause, from first-hand facts only (the
    operator's decisions, the launchers' report, the trainer's records). docs/metrics.md."""

    since: str = Field(description="The start of the job's wall time (its creation).")
    as_of: str = Field(description="The end of the wall time counted (RFC 3339).")
    wall_seconds: float = Field(ge=0, description="Seconds from since to asOf.")
    seconds: LedgerSeconds = Field(description="The wall seconds by cause; they sum to it.")
    goodput: float | None = Field(
        None, ge=0, le=1, description="Productive seconds over wall seconds (0-1)."
    )
    summary: str = Field(description="For printing, e.g. '91.2%'.")
    restarts: list[RungCost] | None = Field(
        None, max_length=len(Rung), description="The measured cost of each rung's restarts."
    )
    fold: LedgerFold = Field(description="The fold's position (for the operator).")


class Forecast(ApiModel):
    """When the job should end, counting its failures (docs/metrics.md, "Forecast")."""

    remaining_seconds: float = Field(ge=0, description="Expected seconds to the last step.")
    p90_seconds: float = Field(ge=0, description="Done within this many seconds, 9 times in 10.")
    eta: str = Field(description="The expected end (RFC 3339).")
    eta_p90: str = Field(description="The 90th-percentile end (RFC 3339).")
    blind_seconds: float = Field(
        ge=0, description="Remaining steps times the step time: the estimate without failures."
    )
    step_seconds: float = Field(ge=0, description="The step time used.")
    failures_per_hour: float = Field(
        ge=0, description="The failure rate used: the job's own, with a prior while it is young."
    )
    seconds_per_failure: float = Field(
        ge=0, description="What a failure costs: recovery by rung, plus the work lost."
    )
    summary: str = Field(description="For printing, e.g. '2h10m (p90 2h40m)'.")


class PlannedParallelism(ApiModel):
    """The planned layout (status.parallelism)."""

    tensor: int = Field(description="Tensor-parallel size.")
    pipeline: int = Field(description="Pipeline-parallel size.")
    virtual_pipeline: int | None = Field(None, description="Virtual pipeline stages per rank.")
    context: int = Field(description="Context-parallel size.")
    expert: int = Field(description="Expert-parallel size.")
    expert_tensor: int = Field(description="Expert tensor-parallel size.")
    data: int = Field(description="Data-parallel size.")
    sequence_parallel: bool = Field(description="Sequence parallelism.")
    fsdp: bool = Field(description="Megatron FSDP.")
    recompute: str | None = Field(
        None,
        description="Activation recomputation it was planned with (absent without spec.training).",
    )


class CoordinatorRecord(ApiModel):
    """The coordinator of the launchers, once it moved (status.coordinator)."""

    pod: str = Field(description="The pod whose launcher coordinates.")
    term: int = Field(ge=0, description="Its term: each move takes a higher one.")


class MegatronJobStatus(ApiModel):
    """Observed state of a MegatronJob."""

    phase: Phase | None = Field(None, description="Lifecycle phase (see Phases in docs/api.md).")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    observed_generation: int | None = Field(None, description="Spec generation last acted on.")
    restart_attempt: int = Field(
        0,
        description="Current attempt (the restart generation): the ranks run it; while the phase "
        "is Restarting, ranks of older attempts stop and none starts.",
    )
    gang_attempt: int | None = Field(
        None,
        description="The attempt whose pods the gang was last created in; in-place restarts keep "
        "them (absent: the same as restartAttempt).",
    )
    launched_attempt: int | None = Field(
        None, description="The latest attempt whose pods were all created."
    )
    restarts: int = Field(0, description="Restarts so far, counted or not.")
    restarts_counted: int = Field(0, description="Restarts that count toward maxRestarts.")
    last_failure: FailureRecord | None = Field(None, description="The latest failure.")
    progress: Progress | None = Field(None, description="Latest training progress.")
    progress_summary: str | None = Field(
        None, description="Short progress for printing, e.g. '1200/5000 loss 2.31'."
    )
    restores: list[Restore] | None = Field(
        None,
        max_length=16,
        description="Where the newest attempts restored from, oldest first (the trainer's "
        "report): the checkpoint tier and step.",
    )
    ledger: Ledger | None = Field(
        None, description="Where the job's wall time went, by cause, and its goodput."
    )
    forecast: Forecast | None = Field(
        None, description="The remaining time and its 90th percentile, counting failures."
    )
    layout: str | None = Field(None, description="Parallel layout, e.g. TP8·PP2·DP4.")
    parallelism: PlannedParallelism | None = Field(
        None,
        description="The degrees the job runs with: with spec.parallelism.auto, the layout the "
        "operator chose (re-planned on a resize).",
    )
    gpus: int | None = Field(
        None,
        description="GPUs the job's pods request (nodes × procsPerNode; 0 on CPU), whether or "
        "not they are running now.",
    )
    world_size: int | None = Field(None, description="Total ranks.")
    start_time: str | None = Field(None, description="When the job was first started.")
    running_since: str | None = Field(None, description="When the current attempt became Running.")
    completion_time: str | None = Field(None, description="When it Succeeded or Failed.")
    restart_at: str | None = Field(
        None, description="While Restarting: when the next attempt starts (after backoff)."
    )
    workload: str | None = Field(None, description="Kueue Workload name, when queued.")
    failed_nodes: list[str] | None = Field(
        None,
        max_length=64,
        description="Nodes where a failure caused a restart since the gang was last recreated: a "
        "second one there recreates the gang (unless spec.restartPolicy."
        "recreateOnRepeatedNodeFailure is false).",
    )
    uncounted_restart_times: list[str] | None = Field(
        None,
        max_length=1000,
        description="When the restarts not counted toward maxRestarts happened in the last hour "
        "(RFC 3339): past the operator's hourly cap, such restarts count.",
    )
    attempt_times: list[str] | None = Field(
        None,
        max_length=32,
        description="When the attempts of the last hour that created a new gang started, "
        "recreates and resumes (RFC 3339): past 5 an hour, the operator's floor before such an "
        "attempt doubles with each one, up to 10 minutes. A restart in place, onto a spare or "
        "of one pod waits only the job's backoff.",
    )
    resume_times: list[str] | None = Field(
        None,
        max_length=32,
        description="When spec.suspend went back to false in the last hour (RFC 3339): from the "
        "second resume of the hour on, the new attempt waits the job's backoff.",
    )
    local_queue: str | None = Field(
        None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name), when queued."
    )
    cluster_queue: str | None = Field(
        None, description="Kueue ClusterQueue that admitted the Workload, while admitted."
    )
    flavors: list[str] | None = Field(
        None, description="Kueue ResourceFlavors of the admission, while admitted."
    )
    kept_pods: list[str] | None = Field(
        None,
        max_length=16,
        description="Failed pods kept for their logs (restartPolicy.keepFailedPods), oldest "
        "first: `kubectl logs` of one shows why its attempt failed.",
    )
    swaps: dict[str, str] | None = Field(
        None,
        max_length=4096,
        description="With spec.resources.spareNodes: the node ranks (keys) held by a pod other "
        "than the one created for them (values), since the gang was last created: a lost "
        "node's rank moved onto a spare (or, later, onto a replacement pod).",
    )
    coordinator: CoordinatorRecord | None = Field(
        None,
        description="With spare nodes, once the coordinator moved off node rank 0's pod: the "
        "launcher whose reports the operator follows.",
    )
    ready_spares: int | None = Field(
        None,
        description="With spec.resources.spareNodes: the spare pods Running whose launcher "
        "is connected and idle, ready to take a lost node's rank.",
    )
    defaults: AppliedDefaults | None = Field(
        None,
        description="The platform's defaults merged under the spec (MegatronJobDefaults and "
        "the operator's own), resolved once when the job was first seen.",
    )
