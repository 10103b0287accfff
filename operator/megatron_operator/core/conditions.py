"""Kubernetes-style conditions on the job's status (pure helpers)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from megatron_operator.core.observe import format_time, parse_time

ConditionList = list[dict[str, Any]]


def set_condition(
    conditions: ConditionList,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> bool:
    """Set one condition in place. lastTransitionTime moves only when the status flips.
    Returns True when the status flipped (or the condition is new)."""
    value = "True" if status else "False"
    type_, reason = str(type_), str(reason)  # plain strings in the stored status, not enums
    for cond in conditions:
        if cond.get("type") == type_:
            flipped = cond.get("status") != value
            if flipped:
                cond["lastTransitionTime"] = format_time(now)
            cond.update(status=value, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
            return flipped
    cond = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_time(now),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    conditions.append(cond)
    return True


def reason_of(conditions: ConditionList, type_: str) -> str | None:
    for cond in conditions:
        if cond.get("type") == type_:
            reason = cond.get("reason")
            return str(reason) if reason is not None else None
    return None


def since(conditions: ConditionList, type_: str, status: bool, reason: str) -> datetime | None:
    """When the condition last turned to `status`, if it is there now with `reason`."""
    value = "True" if status else "False"
    for cond in conditions:
        if cond.get("type") == type_:
            if cond.get("status") == value and cond.get("reason") == str(reason):
                return parse_time(cond.get("lastTransitionTime"))
            return None
    return None
