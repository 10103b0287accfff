"""The one error type of the contract: a configuration the trainer cannot run (exit 78)."""

from __future__ import annotations


class ConfigError(Exception):
    """Every problem found, each naming the field or variable and the fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    def __str__(self) -> str:
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"invalid trainer configuration ({len(self.problems)} problem(s)):\n{lines}"
