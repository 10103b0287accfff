"""What an API failure means for the next reconcile.

Every failure of a call to the apiserver is sorted into one `ErrorKind`, and the kind decides the
retry: a conflict is observed again at once; throttling, a server error or a network failure
backs off exponentially with jitter; a refusal (403: RBAC, Pod Security, a ResourceQuota) will not
go away by itself, so it also becomes a condition and an event on the job, with the apiserver's
own message, so that the job's owner sees why nothing happens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError


class ErrorKind(StrEnum):
    CONFLICT = "Conflict"  # 409: the object changed since it was read
    NOT_FOUND = "NotFound"  # 404
    FORBIDDEN = "Forbidden"  # 403: RBAC, Pod Security admission, a ResourceQuota
    INVALID = "Invalid"  # 422 (and 400): the object itself is refused
    THROTTLED = "Throttled"  # 429: API priority and fairness, or a webhook's rate limit
    UNAVAILABLE = "Unavailable"  # 5xx: the apiserver, etcd or a webhook is unwell
    NETWORK = "Network"  # no HTTP answer at all: a timeout, a reset connection
    OTHER = "Other"  # anything else the apiserver said


@dataclass(frozen=True)
class ApiError:
    kind: ErrorKind
    status: int | None  # the HTTP status, None without an answer
    message: str  # the apiserver's own message, shortened
    retry_after: float | None = None  # the server's Retry-After, when it gave one

    @property
    def persistent(self) -> bool:
        """Will it happen again if nothing changes? Then the job's owner must hear of it."""
        return self.kind in (ErrorKind.FORBIDDEN, ErrorKind.INVALID)

    @property
    def transient(self) -> bool:
        return self.kind in (ErrorKind.THROTTLED, ErrorKind.UNAVAILABLE, ErrorKind.NETWORK)

    def __str__(self) -> str:
        code = f"{self.status} " if self.status is not None else ""
        return f"{code}{self.kind}: {self.message}"


MESSAGE_LIMIT = 1000


def _message(exc: ApiException) -> str:
    try:
        text = str(json.loads(exc.body or "").get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        text = str(exc.body or exc.reason or "")
    return text[:MESSAGE_LIMIT]


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and 0 <= seconds <= 3600 else None


def classify(exc: BaseException) -> ApiError | None:
    """The kind of an API failure; None for an exception that is not one (a bug of ours)."""
    if isinstance(exc, ApiException):
        status = exc.status
        if status == 0 or status is None:
            return ApiError(ErrorKind.NETWORK, None, str(exc.reason or exc)[:MESSAGE_LIMIT])
        kind = {
            409: ErrorKind.CONFLICT,
            404: ErrorKind.NOT_FOUND,
            403: ErrorKind.FORBIDDEN,
            422: ErrorKind.INVALID,
            400: ErrorKind.INVALID,
            429: ErrorKind.THROTTLED,
        }.get(status)
        if kind is None:
            kind = ErrorKind.UNAVAILABLE if status >= 500 else ErrorKind.OTHER
        return ApiError(kind, status, _message(exc), _retry_after(exc))
    if isinstance(exc, TransportError | TimeoutError | ConnectionError):
        return ApiError(ErrorKind.NETWORK, None, f"{type(exc).__name__}: {exc}"[:MESSAGE_LIMIT])
    return None
