"""kopf wiring facts that need no cluster: no handler puts a finalizer on MegatronJobs."""

from __future__ import annotations

import kopf

from megatron_operator.cluster import handlers


def test_no_handler_puts_a_finalizer_on_jobs() -> None:
    # kopf adds a finalizer for every daemon and every non-optional delete handler; then a
    # job (or its namespace) could not be deleted while the operator is down.
    registry = kopf.get_default_registry()
    spawning = registry._spawning.get_all_handlers()
    assert [h.fn for h in spawning] == [handlers.run_job]
    assert not any(h.requires_finalizer for h in spawning)
    assert not any(h.requires_finalizer for h in registry._changing.get_all_handlers())
