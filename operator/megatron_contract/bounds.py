"""The caps on every number a MegatronJob may carry, written once.

The API models (and through them the generated CRD schema and its CEL) enforce them, so the
apiserver and `mjob validate` refuse the same specs. They keep every derived quantity small and
finite: pods rendered by the operator, datetime arithmetic on durations, divisor hints, memory
maths. They live here, beside the layout rules, so a tool on either side of the contract reads
the same figures.
"""

from __future__ import annotations

from typing import Final

INT64_MAX: Final = 2**63 - 1  # what the apiserver stores for an integer
MAX_NODES: Final = 4096  # pods of one job; the chart's admission policy may lower it
MAX_SPARE_NODES: Final = (
    64  # resources.spareNodes: warm pods beside the gang (nodes + spares ≤ MAX_NODES)
)
MAX_PROCS_PER_NODE: Final = 256  # ranks per pod (GPUs, or CPU processes)
MAX_WORLD_SIZE: Final = 65536  # nodes × procsPerNode
MAX_DURATION_SECONDS: Final = 30 * 24 * 3600  # every *Seconds field: 30 days
MAX_ITERATIONS: Final = 10**9  # trainIters and every step count
MAX_LAYERS: Final = 1024
MAX_HIDDEN: Final = 2**20  # hiddenSize, ffnHiddenSize and the per-head dimensions
MAX_HEADS: Final = 4096  # attention heads, query groups
MAX_VOCAB: Final = 2**24
MAX_SEQUENCE: Final = 2**24  # seqLength, maxPositionEmbeddings
MAX_EXPERTS: Final = 4096
MAX_BATCH: Final = 2**24  # globalBatchSize, microBatchSize
MAX_SEED: Final = 2**32 - 1  # numpy's seed range
MAX_RESTARTS: Final = 10000
MAX_GPU_MEMORY_GIB: Final = 4096.0
MAX_LR: Final = 10.0
MAX_KEPT_ATTEMPTS: Final = 10  # restartPolicy.keepFailedPods: failed attempts whose pod is kept
