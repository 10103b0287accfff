"""The pure core: planning, rendering, failure policy and the job state machine. No I/O."""
