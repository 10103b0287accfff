#!/usr/bin/env bash
# Run the trainer image on SLURM with enroot + pyxis, with the same env contract as a MegatronJob
# pod (docs/contract.md §1). See images/enroot.md. Not exercised in this repository's CI (no SLURM).
#
#   images/enroot-slurm.sh import [IMAGE] [OUT.sqsh]       # docker image -> enroot squashfs
#   images/enroot-slurm.sh config JOB.yaml OUT_DIR          # the resolved config.json, via mjob render
#   images/enroot-slurm.sh run IMAGE.sqsh CONFIG_DIR CKPT_DIR [DATA_DIR]   # inside salloc/sbatch
set -euo pipefail

usage() { sed -n '2,8p' "$0" >&2; exit 2; }

cmd_import() {
  local image="${1:-ghcr.io/megatron-operator/trainer:0.1.0}" out="${2:-megatron-trainer.sqsh}"
  # enroot's docker:// syntax separates the registry from the path with '#'.
  local registry="${image%%/*}" path="${image#*/}"
  enroot import --output "$out" "docker://${registry}#${path}"
  echo "wrote $out"
}

cmd_config() {
  local job="$1" out="$2"
  mkdir -p "$out"
  # The operator's own renderer resolves the job (recipe defaults, padded vocab, layout) exactly
  # as it would for pods; we keep only the ConfigMap's config.json.
  mjob render "$job" -o json | python3 -c '
import json, sys
doc = json.load(sys.stdin)
items = doc.get("items", doc) if isinstance(doc, dict) else doc
cm = next(o for o in items if o["kind"] == "ConfigMap")
sys.stdout.write(cm["data"]["config.json"])
' > "$out/config.json"
  python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
print(c["job"]["name"], c["resources"]["nodes"], c["resources"]["procsPerNode"])
' "$out/config.json" > "$out/job.txt"
  echo "wrote $out/config.json (job, nodes, procs per node: $(cat "$out/job.txt"))"
}

cmd_run() {
  local sqsh="$1" config_dir="$2" ckpt_dir="$3" data_dir="${4:-}"
  : "${SLURM_JOB_ID:?run inside an allocation (salloc or sbatch)}"
  read -r job nodes procs < "$config_dir/job.txt"
  if [ "${SLURM_JOB_NUM_NODES}" -ne "$nodes" ]; then
    echo "the config wants $nodes nodes; this allocation has ${SLURM_JOB_NUM_NODES}" >&2
    exit 2
  fi
  local master
  master="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
  # The pod's mounts: the config at /etc/megatron, the checkpoint volume at /mnt/checkpoints,
  # datasets wherever the job's data paths point (mount DATA_DIR at the same path).
  local mounts="$config_dir:/etc/megatron:ro,$ckpt_dir:/mnt/checkpoints"
  if [ -n "$data_dir" ]; then mounts="$mounts,$data_dir:$data_dir:ro"; fi
  # One task per node, like one pod per node; NODE_RANK comes from SLURM_NODEID inside the task.
  export MASTER_ADDR="$master" MASTER_PORT="${MASTER_PORT:-29500}" \
    NNODES="$nodes" NPROC_PER_NODE="$procs" WORLD_SIZE="$((nodes * procs))" \
    MEGATRON_CONFIG=/etc/megatron/config.json MEGATRON_JOB_NAME="$job" \
    MEGATRON_RESTART_ATTEMPT="${SLURM_RESTART_COUNT:-0}" \
    MEGATRON_PROGRESS_FILE="/mnt/checkpoints/progress-$job.jsonl"
  # No MEGATRON_PROGRESS_LEASE: without an apiserver, progress goes to that file and stdout.
  unset MEGATRON_PROGRESS_LEASE
  srun --ntasks-per-node=1 --container-image="$sqsh" --container-mounts="$mounts" \
    --container-workdir=/opt/megatron-operator --no-container-mount-home \
    bash -c 'NODE_RANK=$SLURM_NODEID POD_NAME=$SLURMD_NODENAME exec python -m megatron_trainer'
}

case "${1:-}" in
  import) shift; cmd_import "$@" ;;
  config) shift; [ $# -eq 2 ] || usage; cmd_config "$@" ;;
  run) shift; [ $# -ge 3 ] || usage; cmd_run "$@" ;;
  *) usage ;;
esac
