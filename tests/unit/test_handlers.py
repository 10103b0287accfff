"""kopf wiring facts that need no cluster: no handler puts a finalizer on MegatronJobs, and kopf
keeps no job's body (no daemon: a daemon's object lives in kopf's memory for its life)."""

from __future__ import annotations

import kopf

from megatron_operator.cluster import handlers


def test_no_handler_puts_a_finalizer_on_jobs_or_keeps_their_body() -> None:
    # kopf adds a finalizer for every daemon and every non-optional delete handler; then a
    # job (or its namespace) could not be deleted while the operator is down. A daemon also
    # keeps the whole job in memory ("live fresh body") while it runs.
    registry = kopf.get_default_registry()
    assert registry._spawning.get_all_handlers() == []
    assert registry._changing.get_all_handlers() == []
    assert [h.fn for h in registry._watching.get_all_handlers()] == [handlers.job_changed]
