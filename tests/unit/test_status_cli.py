"""`mjob status`'s text, from a job's status, pods and events (the pure part of the command; the
integration tests run it against a real apiserver)."""

from __future__ import annotations

from megatron_operator.cli.status import describe

from .sim import Sim
from .specs import job_doc, spec_of


def test_the_story_of_a_restarted_job() -> None:
    policy = {"backoffSeconds": 0, "maxBackoffSeconds": 0, "strategy": "Recreate"}
    doc = job_doc(spec_of({"restartPolicy": policy}))
    doc["metadata"].update(uid="uid-1", generation=1, name="job")
    sim = Sim(job=doc)
    sim.settle()
    sim.run_all()
    sim.step()
    sim.fail("job-a0-1", exit_code=9)
    sim.settle()
    sim.run_all()
    sim.step()
    events = [
        {
            "type": "Warning",
            "reason": r,
            "message": m,
            "lastTimestamp": f"2026-11-22T12:00:{i:02d}Z",
        }
        for i, (r, m) in enumerate(sim.events)
    ]
    text = describe(sim.job, list(sim.pods.values()), events)
    lines = text.splitlines()
    assert lines[0] == (
        "MegatronJob default/job: Running, attempt 1 (1 restarts, 1 counted of maxRestarts 3)"
    )
    assert "layout DP16, 16 GPUs, world size 16" in lines[1]
    assert any(line.startswith("Last failure:") for line in lines)
    assert "Error (job-a0-1 on node-1, exit 9) → Restart" in text
    kept = next(line for line in lines if line.strip().startswith("job-a0-1"))
    assert "Failed" in kept and "kept for its logs" in kept and "exit 9" in kept
    assert "AttemptFailed" in text and "attempt 0: 1 pod(s) failed: pod job-a0-1" in text
    assert text.index("job-a0-1 ") < text.index("job-a1-0 ")  # pods by attempt, then rank


def test_a_new_job_has_a_short_story() -> None:
    text = describe(job_doc(spec_of(), name="fresh"), [], [])
    assert text.startswith("MegatronJob default/fresh: New, attempt 0")
    assert "Pods: none" in text and "Events" not in text


def test_what_a_pod_or_an_event_says_cannot_drive_the_terminal() -> None:
    """A termination message (copied into status.lastFailure) and an event are written by
    whoever controls the pod: escape sequences and line breaks in them are shown escaped, so
    they can neither recolour or clear the terminal nor forge a line of the story."""
    hostile = "boom\x1b[2J\x1b]0;owned\x07\r\nConditions:\n  Failed  True  \u202eevil\x9b31m"
    doc = job_doc(spec_of(), name="job")
    doc["status"] = {
        "phase": "Running",
        "lastFailure": {"reason": "Error", "pod": "job-a0-1", "action": "Restart",
                        "message": hostile},
        "conditions": [{"type": "Running", "status": "True", "reason": "Ok", "message": hostile}],
    }  # fmt: skip
    events = [{"type": "Warning", "reason": "X", "message": hostile, "lastTimestamp": "t"}]
    text = describe(doc, [], events)
    assert not any(ord(c) < 0x20 and c != "\n" for c in text)
    assert not any(0x7F <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E for c in text)
    assert text.count("\nConditions:") == 1  # no forged section
    assert "boom\\x1b[2J\\x1b]0;owned\\x07\\r\\nConditions:" in text
