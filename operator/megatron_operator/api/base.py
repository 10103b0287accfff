"""Shared pieces of the API models: the base class and a few constrained scalar types.

The models mirror what the apiserver enforces from the generated CRD: camelCase names only,
unknown fields rejected, and strict types (a string "3" is not an integer, as in Kubernetes).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every API model: camelCase aliases, no unknown fields, strict scalar types."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        extra="forbid",
        strict=True,
        frozen=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The model as the apiserver would store it (camelCase, unset optionals omitted)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# A Kubernetes resource quantity, e.g. "80Gi", "500m", 8. Same grammar as apimachinery's.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _check_quantity(value: object) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("must be a Kubernetes quantity such as 8, '500m' or '80Gi'")
    if isinstance(value, str) and not _QUANTITY_RE.match(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes quantity: use a form like '500m' or '80Gi'"
        )
    return value


Quantity = Annotated[
    str | int,
    BeforeValidator(_check_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]


def _check_auto_or_positive(value: object) -> str | int:
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"must be 'auto' or a positive integer, got {value!r}")


AutoOrPositiveInt = Annotated[
    str | int,
    BeforeValidator(_check_auto_or_positive),
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


def one_of(values: tuple[str, ...]) -> BeforeValidator:
    """A string restricted to `values` (a contract choice list), checked like a Literal."""

    def check(value: object) -> str:
        if not isinstance(value, str) or value not in values:
            raise ValueError(f"must be one of: {', '.join(values)} (got {value!r})")
        return value

    return BeforeValidator(check)


def enum_schema(values: tuple[str, ...]) -> WithJsonSchema:
    """The CRD schema of a `one_of` string: an enum the apiserver enforces."""
    return WithJsonSchema({"type": "string", "enum": list(values)})
