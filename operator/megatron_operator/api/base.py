"""Shared pieces of the API models: the base class and a few constrained scalar types.

The models mirror what the apiserver enforces from the generated CRD: camelCase names only,
unknown fields rejected, and strict types (a string "3" is not an integer, as in Kubernetes).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from megatron_contract.bounds import MAX_DURATION_SECONDS, MAX_WORLD_SIZE

GROUP: Final = "megatron.dev"  # the API group, and the prefix of the operator's labels

# Bounds on the document itself, which only the loader reads.
MAX_DEPTH: Final = 64  # nesting of a MegatronJob document (the schema needs about 8)
MAX_DOCUMENT_BYTES: Final = 3 * 1024 * 1024  # the apiserver's request size limit


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


# A Kubernetes resource quantity, e.g. "80Gi", "500m", 8: apimachinery's grammar without the
# minus sign and with bounded digits (at most 18 before the point, 9 after, a 2-digit exponent),
# so every quantity accepted here is one the apiserver accepts, and none is absurd or negative.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]{1,18}(\.[0-9]{0,9})?)|(\.[0-9]{1,9}))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][-+]?[0-9]{1,2}))?$"
)
MAX_QUANTITY_INT: Final = 10**18
QUANTITY_MAX_LENGTH: Final = 40
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _check_quantity(value: object) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("must be a Kubernetes quantity such as 8, '500m' or '80Gi'")
    if isinstance(value, int) and not 0 <= value <= MAX_QUANTITY_INT:
        raise ValueError(f"must be between 0 and {MAX_QUANTITY_INT}, got {value}")
    if isinstance(value, str) and not _QUANTITY_RE.fullmatch(value):
        raise ValueError(
            f"{value[:40]!r} is not a Kubernetes quantity: use a non-negative form like "
            "'500m' or '80Gi' (at most 18 digits)"
        )
    return value


_SUFFIX: Final[dict[str, Decimal | int]] = {
    **{"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")},
    **{"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18},
    **{"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60},
}
_QUANTITY_PARTS = re.compile(r"\+?([0-9]*\.?[0-9]*)(.*)")


def quantity_value(value: str | int) -> Decimal:
    """The exact value of a Quantity (already checked by QUANTITY_PATTERN), as the apiserver
    compares them: '500m' < '1' < '1Ki' < '1e4'."""
    if isinstance(value, int):
        return Decimal(value)
    m = _QUANTITY_PARTS.fullmatch(value)
    assert m is not None
    number, suffix = Decimal(m.group(1)), m.group(2)
    if suffix[:1] in ("e", "E") and suffix not in ("E", "Ei"):
        return number * Decimal(10) ** int(suffix[1:])
    return number * Decimal(_SUFFIX[suffix])


Quantity = Annotated[
    str | int,
    BeforeValidator(_check_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            # The pattern allows at most 36 characters; the cap bounds the CEL cost of
            # comparing requests with limits.
            "maxLength": QUANTITY_MAX_LENGTH,
            "minimum": 0,
            "maximum": MAX_QUANTITY_INT,
        }
    ),
]


def _check_auto_or_positive(value: object) -> str | int:
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WORLD_SIZE:
        return value
    raise ValueError(
        f"must be 'auto' or a positive integer up to {MAX_WORLD_SIZE}, got {_short(value)}"
    )


AutoOrPositiveInt = Annotated[
    str | int,
    BeforeValidator(_check_auto_or_positive),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "minimum": 1, "maximum": MAX_WORLD_SIZE}),
]

# Every field using these sets its own maximum (`le=`): tests/unit/test_adversarial.py checks
# that every number in the generated schema has one. (An `le` here would override the field's.)
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Seconds = Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)]
# JSON has no inf or NaN, so the apiserver cannot hold them; every spec float is Finite.
Finite = Annotated[float, Field(allow_inf_nan=False)]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Names, as Kubernetes validates them (apimachinery's validation package).
DNS1123_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
# A qualified name (label key, taint key): an optional DNS-subdomain prefix and '/', then a
# name of at most 63 characters. The prefix's own 253-character limit is QUALIFIED_PREFIX_PATTERN.
QUALIFIED_NAME_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUALIFIED_PREFIX_PATTERN: Final = r"^([^/]{1,253}/)?[^/]*$"
QUALIFIED_NAME_MAX: Final = 253 + 1 + 63
LABEL_VALUE_PATTERN: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ENV_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]*$"
# No '.' or '..' segment: the path cannot climb out of the directory it is joined to.
PARENT_SEGMENT_PATTERN: Final = r"(^|/)[.][.]?(/|$)"

_QUALIFIED_RE = re.compile(QUALIFIED_NAME_PATTERN)
_QUALIFIED_PREFIX_RE = re.compile(QUALIFIED_PREFIX_PATTERN)
_PARENT_RE = re.compile(PARENT_SEGMENT_PATTERN)


def qualified_name_problem(value: str) -> str | None:
    """Why `value` is not a Kubernetes qualified name (a label or taint key), or None."""
    if len(value) > QUALIFIED_NAME_MAX or not _QUALIFIED_PREFIX_RE.fullmatch(value):
        return "the prefix before '/' must be at most 253 characters and the name at most 63"
    if not _QUALIFIED_RE.fullmatch(value):
        return (
            "must be a label key: an optional DNS prefix and '/', then at most 63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit "
            "(e.g. example.com/rack)"
        )
    return None


def _check_qualified_name(value: str) -> str:
    problem = qualified_name_problem(value)
    if problem:
        raise ValueError(f"{_short(value)}: {problem}")
    return value


def _check_path(value: str) -> str:
    if _PARENT_RE.search(value):
        raise ValueError(f"{_short(value)} has a '.' or '..' segment: give the path without them")
    return value


QualifiedName = Annotated[
    str,
    AfterValidator(_check_qualified_name),
    WithJsonSchema(
        {"type": "string", "maxLength": QUALIFIED_NAME_MAX, "pattern": QUALIFIED_NAME_PATTERN}
    ),
]

# The same check for map keys (nodeSelector): no JSON-schema pattern, which pydantic would turn
# into patternProperties (not structural); the CRD checks keys with a CEL rule (cel.py).
LabelKey = Annotated[str, AfterValidator(_check_qualified_name)]


def _check_toleration_key(value: str) -> str:
    return value if value == "" else _check_qualified_name(value)


# A taint key in a toleration: a qualified name, or empty (with Exists: every taint).
TolerationKey = Annotated[
    str,
    AfterValidator(_check_toleration_key),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": QUALIFIED_NAME_MAX,
            "pattern": f"^$|{QUALIFIED_NAME_PATTERN}",
        }
    ),
]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
DnsSubdomain = Annotated[
    str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)
]
EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)]
# A path with no '.' or '..' segment (the CRD checks the same with a CEL rule, cel.py).
SafePath = Annotated[str, AfterValidator(_check_path)]


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


class Toleration(ApiModel):
    """A Kubernetes toleration, copied to every pod."""

    key: TolerationKey | None = Field(
        None, description="Taint key; empty matches all keys with Exists."
    )
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal.")
    value: LabelValue | None = Field(None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: Seconds | None = Field(
        None,
        description="For NoExecute: how long to stay bound. At most "
        f"{MAX_DURATION_SECONDS} s ({MAX_DURATION_SECONDS // 86400} days).",
    )
