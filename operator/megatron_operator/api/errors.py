"""Spec errors that name the field and say how to fix it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class FieldError:
    """One problem with a spec: the field path (e.g. spec.parallelism.tensor) and what to do."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A spec is invalid. Carries every problem found, not only the first."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = sorted(set(errors), key=lambda e: (e.path, e.message))
        super().__init__("\n".join(str(e) for e in self.errors))
