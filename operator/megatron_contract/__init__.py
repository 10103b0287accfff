"""The operator ↔ trainer contract: every fact both sides need, written once (standard library only).

- `env`: the trainer container's environment (names, and the one parser).
- `exitcodes`: what the trainer's exit code means.
- `paths`: mount points, the config key, the checkpoint layout, the progress record's key.
- `choices`: the allowed values of every enumerated config field.
- `recipes`: the built-in model presets.
- `config`: the resolved trainer configuration (typed dataclasses, one serialiser, one parser).
- `rules`: the layout rules over that configuration, shared by the planner and the trainer.
- `bounds`: the caps on every spec number (nodes, world size, durations, int64), which the API
  models and the generated CRD enforce.
- `timeline`: where a trainer process's time went (the progress record's `clock`), for the
  operator's goodput ledger.

The operator renders a config with `config.to_json`; the trainer reads it with `config.parse_config`.
The CRD's CEL rules are the one second copy of `rules`, and `tests/unit/test_rules.py` checks that
they agree.
"""
