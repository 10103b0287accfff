"""Loading DistributedOptimizer checkpoints with torch's Adam (no TE/Apex), Megatron-Core 0.16.1.

Megatron-Core's checkpoint code for the distributed optimizer is written against TE's or Apex's
FusedAdam, which keeps `step` in the param groups. torch.optim.Adam (used on CPU, and on GPUs
without TE or Apex) keeps a `step` tensor per parameter instead, which breaks the load in three
ways; each function below fixes one, and all are no-ops when TE or Apex provides the optimizer.
tests/trainer/test_resume.py shows resumed losses bit-identical to an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from megatron.core.optimizer import distrib_optimizer


def _torch_adam() -> bool:
    return not distrib_optimizer.HAVE_APEX_OR_TE


def _subs(optimizer: Any) -> list[Any]:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def prepare_for_load(optimizer: Any) -> None:
    """Allocate torch Adam's per-parameter state before building the state dict to load into.

    DistributedOptimizer.state_dict() reads each parameter's `step`, which torch's Adam creates on
    its first step only, so a fresh optimizer cannot even describe what it wants loaded. Megatron's
    own dummy step (zero gradients) allocates it; every value it touches is then overwritten.
    """
    if not _torch_adam():
        return
    for sub in _subs(optimizer):
        if len(sub.optimizer.state) == 0:
            sub._init_optimizer_states_with_dummy_values()


@contextmanager
def _keep_step_when_absent(sub: Any) -> Iterator[None]:
    """The fully_reshardable format stores no per-parameter `step` (FusedAdam has none), but
    `_set_main_param_and_optimizer_states` copies every key of torch Adam's state from the
    checkpoint and raises KeyError('step'). Let a missing step keep its current value."""
    original = sub._set_main_param_and_optimizer_states

    def set_states(model_param: Any, tensors: dict[str, Any]) -> Any:
        if "step" not in tensors:
            group, order = sub.model_param_group_index_map[model_param]
            main_param = sub.optimizer.param_groups[group]["params"][order]
            step = sub.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step}
        return original(model_param, tensors)

    sub._set_main_param_and_optimizer_states = set_states
    try:
        yield
    finally:
        del sub._set_main_param_and_optimizer_states  # back to the class's method


def _restore_steps(sub: Any, state: Any) -> None:
    """Give every parameter its own copy of the checkpoint's Adam step.

    load_state_dict writes the saved step into the per-parameter states and then copies over it
    the parameter state captured before the load (with the pre-load step); it also shares one step
    tensor between all parameters, which torch's Adam increments once per parameter. Either way
    the bias correction after a resume would differ from the uninterrupted run. The step saved
    with the param groups is the true one.
    """
    steps = {g["step"] for g in state["optimizer"]["param_groups"] if "step" in g}
    if len(steps) != 1:
        raise RuntimeError(f"the checkpoint's optimizer state has no single Adam step: {steps}")
    step = float(steps.pop())
    for param_state in sub.optimizer.state.values():
        if "step" in param_state:
            param_state["step"] = torch.tensor(step, dtype=torch.float32)


def load_optimizer_state(optimizer: Any, loaded: Any) -> None:
    """optimizer.load_state_dict(loaded), corrected for torch's Adam."""
    subs = _subs(optimizer)
    # In fp32 the main parameters are views of the model's parameters, and copying into a view
    # of a leaf that requires grad is an autograd error: load without grad tracking.
    with torch.no_grad():
        if not _torch_adam():
            optimizer.load_state_dict(loaded)
            return
        with _all(_keep_step_when_absent(sub) for sub in subs):
            optimizer.load_state_dict(loaded)
    states = [loaded] if len(subs) == 1 else [v for _, v in sorted(loaded.items())]
    for sub, state in zip(subs, states, strict=True):
        _restore_steps(sub, state)


@contextmanager
def _all(managers: Iterator[Any]) -> Iterator[None]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield
