"""Who may read /metrics: the caller's bearer token, checked by the apiserver, as
controller-runtime's secure metrics serving does (`filters.WithAuthenticationAndAuthorization`).

1. A TokenReview (authentication.k8s.io/v1) turns the token into a user and groups.
2. A SubjectAccessReview (authorization.k8s.io/v1) asks whether that user may `get` the
   non-resource URL `/metrics`. The chart's `<release>-metrics-reader` ClusterRole grants it;
   bind it to Prometheus's ServiceAccount.

Answers are cached per token (hashed) for `CACHE_SECONDS`, at most `CACHE_ENTRIES` of them, so a
scrape every 30 s costs no API call and a flood of made-up tokens cannot grow memory. Made-up
tokens cost no API call either: only a JWT (a ServiceAccount's, or an OIDC token) is reviewed,
and reviews of tokens not in the cache are rate-limited (`REVIEWS_PER_SECOND`, a burst of
`REVIEW_BURST`); over the limit the caller gets 429 and the apiserver nothing. The operator's
ServiceAccount needs `create` on tokenreviews and subjectaccessreviews (the chart grants both).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import kubernetes

log = logging.getLogger(__name__)

CACHE_SECONDS = 60.0
CACHE_ENTRIES = 1024
CALL_TIMEOUT = (5.0, 10.0)
REVIEWS_PER_SECOND = 5.0  # a few scrapers, each reviewed once a minute, need a fraction of it
REVIEW_BURST = 20
# A JWT: three base64url parts (the signature may be empty only for alg none, which the
# apiserver refuses anyway).
_JWT = re.compile(r"[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]+")


class Decision:
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # 401: no token, or the apiserver does not know it
    FORBIDDEN = "forbidden"  # 403: a known identity without the right
    THROTTLED = "throttled"  # 429: too many unknown tokens to review just now


class Bucket:
    """A token bucket: `take()` is True at most `rate` times a second, `burst` at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, float(burst), clock
        self.level, self.at = float(burst), clock()

    def take(self) -> bool:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level < 1.0:
            return False
        self.level -= 1.0
        return True


class TokenAuthorizer:
    """allowed(token, path) through TokenReview and SubjectAccessReview, cached."""

    def __init__(self, api_client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.authn = kubernetes.client.AuthenticationV1Api(api_client)
        self.authz = kubernetes.client.AuthorizationV1Api(api_client)
        self.clock = clock
        self.lock = threading.Lock()
        self.cache: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.reviews = Bucket(REVIEWS_PER_SECOND, REVIEW_BURST, clock)

    def decide(self, authorization: str | None, path: str) -> str:
        token = _bearer(authorization)
        if token is None or not _JWT.fullmatch(token):
            return Decision.UNAUTHENTICATED
        key = hashlib.sha256(f"{path}\0{token}".encode()).hexdigest()
        now = self.clock()
        with self.lock:
            hit = self.cache.get(key)
            if hit is not None and hit[1] > now:
                self.cache.move_to_end(key)
                return hit[0]
            if not self.reviews.take():
                return Decision.THROTTLED
        decision = self._ask(token, path)
        with self.lock:
            self.cache[key] = (decision, now + CACHE_SECONDS)
            self.cache.move_to_end(key)
            while len(self.cache) > CACHE_ENTRIES:
                self.cache.popitem(last=False)
        return decision

    def _ask(self, token: str, path: str) -> str:
        review = _call(
            self.authn.create_token_review,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision.UNAUTHENTICATED
        user = status.get("user") or {}
        access = _call(
            self.authz.create_subject_access_review,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username"),
                    "uid": user.get("uid"),
                    "groups": user.get("groups") or [],
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": path, "verb": "get"},
                },
            },
        )
        allowed = (access.get("status") or {}).get("allowed") is True
        return Decision.ALLOWED if allowed else Decision.FORBIDDEN


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 16384:
        return None
    return token


def _call(method: Any, body: dict[str, Any]) -> dict[str, Any]:
    resp = method(body, _preload_content=False, _request_timeout=CALL_TIMEOUT)
    try:
        doc = json.loads(resp.data)
    finally:
        resp.release_conn()
    return doc if isinstance(doc, dict) else {}
