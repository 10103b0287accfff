"""How fast a job may start new gangs, whatever its spec says (pure).

Every new attempt of a job deletes and creates a whole gang: up to 4,096 pods, 8,192 API calls,
the scheduler's and the kubelets' work. The job's own `restartPolicy` spaces failures
(`backoffSeconds`, doubling, up to `maxBackoffSeconds`), but a spec may set both to 0 with
`maxRestarts: 10000`, and toggling `spec.suspend` starts a fresh attempt each time. So the
operator keeps a floor of its own over every attempt that makes a new gang, a recreate or a
resume (a lower rung of the restart ladder makes at most the lost pods, and one that fails
before its first step becomes a recreate):

- the times of those attempts started in the last hour are kept in `status.attemptTimes`
  (at most `MAX_KEPT`: past that the floor is at its cap anyway);
- the first `FREE_PER_HOUR` attempts of an hour wait `MIN_BACKOFF_SECONDS` (1 s); each one
  after doubles the wait, up to `FLOOR_CAP_SECONDS`;
- a resume (spec.suspend back to false) also follows the job's own backoff schedule: the first
  resume of an hour waits only the floor, the next `backoffSeconds`, then twice that, and so
  on (`status.resumeTimes`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from megatron_operator.api.spec import RestartPolicySpec
from megatron_operator.core.observe import format_time, parse_time
from megatron_operator.core.policy import MIN_BACKOFF_SECONDS, backoff_seconds

WINDOW_SECONDS: Final = 3600.0
FREE_PER_HOUR: Final = 5
FLOOR_CAP_SECONDS: Final = 600.0
MAX_KEPT: Final = 32


def recent(times: list[str] | None, now: datetime) -> list[str]:
    """The times of `times` in the last hour (unreadable or future ones dropped), oldest first."""
    since = now - timedelta(seconds=WINDOW_SECONDS)
    parsed = [parse_time(t) for t in times or []]
    kept = sorted(t for t in parsed if t is not None and since < t <= now)
    return [format_time(t) for t in kept][-MAX_KEPT:]


def floor_seconds(started_last_hour: int) -> float:
    """The operator's wait before a new attempt, given how many started in the last hour."""
    extra = max(started_last_hour + 1 - FREE_PER_HOUR, 0)
    if extra >= 20:  # 2^20 s is far past the cap
        return FLOOR_CAP_SECONDS
    return float(min(MIN_BACKOFF_SECONDS * 2**extra, FLOOR_CAP_SECONDS))


def resume_seconds(policy: RestartPolicySpec, attempts: int, resumes: int) -> float:
    """The wait before a resumed job's new attempt: the floor, and from the second resume of
    the hour on, the job's own backoff schedule (`resumes`: those of the last hour before)."""
    wait = floor_seconds(attempts)
    if resumes >= 1:
        wait = max(wait, backoff_seconds(policy, resumes - 1))
    return wait
