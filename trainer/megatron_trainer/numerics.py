"""Non-finite loss and gradients: fail the step before anything is saved (stdlib only).

A NaN or Inf loss poisons the weights at the next optimizer step and every checkpoint after it.
Two checks stop that, both before the optimizer step and before any save of the step:
- the loss function checks each micro-batch's loss on the last pipeline stage, as Megatron-LM's
  `pretrain_gpt.loss_func` does through the rerun state machine (check_for_nan_in_loss_and_grad);
- Megatron-Core's DDP checks each gradient bucket's norm before the data-parallel reduction
  (`DistributedDataParallelConfig.check_for_nan_in_grad`), which raises a RuntimeError.
Both end the rank with ExitCode.NON_FINITE (17), which the launcher passes on as the pod's exit code.
Megatron FSDP has no such gradient check (its reduce-scatter never reads
check_for_nan_in_grad), so there a finite loss with NaN/Inf gradients is caught after the
optimizer step by its gradient norm (`check_grad_norm`): still before any save of the step.
"""

from __future__ import annotations

import math
import os
from typing import Any

from megatron_contract.env import INJECT_NAN_LOSS
from megatron_contract.errors import ConfigError


class NonFiniteLoss(Exception):
    """The loss or the gradients of this step are NaN or Inf."""


def check_loss(loss_sum: Any, tokens: Any) -> None:
    """Raise NonFiniteLoss when a micro-batch's summed loss is NaN or Inf (a host sync, as in
    Megatron-LM's loss function)."""
    value = float(loss_sum.detach().item())
    if not math.isfinite(value):
        raise NonFiniteLoss(
            f"the loss of a micro-batch is {value} (over {int(tokens.item())} tokens); "
            "stopping before the optimizer step and before any checkpoint of this step"
        )


def is_non_finite_grad_error(err: BaseException) -> bool:
    """True for the RuntimeError of Megatron-Core's DDP gradient check (the rerun state machine's
    `validate_result` with reruns disabled: "Unexpected result ... found NaN/Inf in local grad
    norm ...")."""
    text = str(err)
    return (
        isinstance(err, RuntimeError)
        and "Unexpected result" in text
        and ("found NaN" in text or "found Inf" in text)
    )


def nan_injection_iteration(environ: dict[str, str] | None = None) -> int | None:
    """The iteration named by MEGATRON_INJECT_NAN_LOSS, or None."""
    raw = (os.environ if environ is None else environ).get(INJECT_NAN_LOSS, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise ConfigError(
            [f"{INJECT_NAN_LOSS}: expected an iteration number such as '3', got {raw!r}"]
        )
    return int(raw)


def check_grad_norm(updated: bool, grad_norm: float | None) -> None:
    """Raise NonFiniteLoss when an applied step's gradient norm is NaN or Inf (Megatron FSDP:
    nothing checked the gradients before the step). A step the fp16 loss scaler skipped is not
    an error: the scaler handles its overflow."""
    if updated and grad_norm is not None and not math.isfinite(grad_norm):
        raise NonFiniteLoss(
            f"the gradient norm of this step is {grad_norm}; stopping before any checkpoint of "
            "this step (the weights it updated are not saved)"
        )
