"""Megatron FSDP's checkpoint format, `fsdp_dtensor`, as Megatron-LM (core_v0.16.1,
megatron/training/checkpointing.py) writes and reads it: the only format it allows with
--use-megatron-fsdp.

An iteration directory is plain torch DCP: `.metadata` (written last) and `*.distcp`, no
`common.pt` and no `metadata.json`. Its state dict is Megatron-LM's `generate_state_dict` for
that format: `args`, `checkpoint_version`, `iteration`, `model` (the FSDP module's own
`state_dict_for_save_checkpoint`: DTensor shards), `optimizer` (the distributed optimizer's
`sharded_state_dict` with sharding type `fsdp_dtensor`), `opt_param_scheduler`, and `rng_state`
as a dict keyed "(pp rank, tp rank)". Before DCP sees it, Megatron-LM's
`preprocess_fsdp_dtensor_state_dict` splits SwiGLU's fused first linear layer into its two
halves, renumbers experts globally, drops FP8's extra state, and gives unevenly sharded DTensors
their chunk metadata; `preprocess` here does the same with Megatron-Core's functions. Our own
record (`trainer`, the same as in a torch_dist checkpoint's common state) is one more entry, a
JSON string, so a scan reads it without torch's unpickler running anything but `torch.load`'s
weights-only one.

What needs CUDA (Megatron FSDP builds only there) is `state_dict` and `preprocess`'s SwiGLU and
expert steps; `save`, `load`, `read_common` and the uneven-DTensor step run on any DTensors,
and tests/trainer/test_data_parallel_cpu.py runs them on two gloo ranks.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from .storage import LocalStorage, storage_for

CHECKPOINT_VERSION = 3.0  # Megatron-LM's (checkpointing.py)
TRAINER_KEY = "trainer"  # our record, as a JSON string
# The top-level non-tensor entries a scan and a resume read without loading any tensor.
COMMON_KEYS = ("args", "checkpoint_version", "iteration", TRAINER_KEY)


def optimizer_metadata(dp_cp_group: Any) -> dict[str, Any]:
    """Megatron-LM's `_build_sharded_state_dict_metadata` with --ckpt-format fsdp_dtensor."""
    return {
        "distrib_optim_sharding_type": "fsdp_dtensor",
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
        "dp_cp_group": dp_cp_group,
    }


def state_dict(
    chunks: list[tuple[str, Any]],
    optimizer: Any,
    scheduler: Any,
    *,
    args: Any,
    iteration: int,
    rng_key: str,
    rng: list[dict[str, Any]] | None,
    dp_cp_group: Any,
    is_loading: bool,
) -> dict[str, Any]:
    """Megatron-LM's `generate_state_dict` for fsdp_dtensor. `chunks`: (key, FSDP-wrapped
    chunk), `rng_key`: "(pp rank, tp rank)"; `rng` None leaves the RNG state out."""
    state: dict[str, Any] = {
        "args": args,
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": iteration,
    }
    for key, chunk in chunks:
        state[key] = chunk.state_dict_for_save_checkpoint()
    state["optimizer"] = optimizer.sharded_state_dict(
        state, is_loading=is_loading, metadata=optimizer_metadata(dp_cp_group)
    )
    state["opt_param_scheduler"] = scheduler.state_dict()
    if rng is not None:
        state["rng_state"] = {rng_key: rng}
    return state


def preprocess(state: dict[str, Any], chunk: Any, swiglu: bool, num_experts: int | None) -> Any:
    """Megatron-LM's `preprocess_fsdp_dtensor_state_dict` (checkpointing.py), with the
    functions it calls from Megatron-Core: returns the state dict DCP saves or loads."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer import fsdp_dtensor_checkpoint as fsdp

    state = state.copy()
    if "model" in state:
        fsdp.handle_fp8_extra_state_case(state["model"])
        if swiglu:
            model_sd, optim_sd = fsdp.handle_swiglu_in_state_dict(
                chunk, state["model"], state.get("optimizer")
            )
            state["model"] = model_sd
            if optim_sd is not None:
                state["optimizer"] = optim_sd
        if num_experts:
            state["model"] = fsdp.handle_experts_in_state_dict(state["model"], num_experts)
    preprocess_state_dict_for_uneven_dtensor(state)
    return state


def save(state: dict[str, Any], path: str) -> None:
    """Collective: every rank writes its shards to `path` (rank 0 made it), `.metadata` last."""
    dcp_save(state_dict=state, storage_writer=FileSystemWriter(path))


def load(state: dict[str, Any], path: str) -> None:
    """Collective: DCP fills `state`'s tensors in place and replaces its other entries. As
    Megatron-LM's default (no --strict-fsdp-dtensor-load), entries the checkpoint lacks are
    left as they are (e.g. a layer's FP8 extra state)."""
    dcp_load(
        state_dict=state,
        storage_reader=FileSystemReader(path),
        planner=DefaultLoadPlanner(allow_partial_load=True),
    )


def read_common(path: str, metadata: Any, keys: Iterable[str] = COMMON_KEYS) -> dict[str, Any]:
    """The top-level non-tensor entries `keys` of the DCP checkpoint at `path` whose (safely
    read) `.metadata` is `metadata`, without loading any tensor. Our record comes back as a
    dict."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    store = storage_for(path)
    wanted = set(keys)
    found: dict[str, Any] = {}
    for index, info in (metadata.storage_data or {}).items():
        fqn = index.fqn
        if fqn not in wanted or not isinstance(
            metadata.state_dict_metadata.get(fqn), BytesStorageMetadata
        ):
            continue
        blob = _read_range(store, store.join(path, info.relative_path), info.offset, info.length)
        found[fqn] = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if isinstance(found.get(TRAINER_KEY), str):
        found[TRAINER_KEY] = json.loads(found[TRAINER_KEY])
    return found


def _read_range(store: Any, path: str, offset: int, length: int) -> bytes:
    if isinstance(store, LocalStorage):
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    return bytes(store.read_bytes(path)[offset : offset + length])
