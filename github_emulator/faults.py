"""Fault injection: make matching requests fail the way GitHub sometimes does."""

from __future__ import annotations

import fnmatch
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

SECONDARY_RATE_LIMIT_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID."
)
PRIMARY_RATE_LIMIT_MESSAGE = "API rate limit exceeded for installation."
RATE_LIMIT_DOCS = (
    "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
    "#about-secondary-rate-limits"
)


@dataclass
class Fault:
    """Answer `remaining` requests matching method/path with status/body/headers.

    `path` is a glob where `*` also matches `/` (e.g. "/repos/*/pulls/*/reviews").
    `remaining=None` means every matching request fails until cleared.
    """

    method: str
    path: str
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    remaining: int | None = 1
    hits: int = 0
    rate: float = 1.0  # the share of matching requests it answers (drawn per request)
    delay: float = 0.0  # a hold (status 0): seconds the request waits, then it is answered normally

    @property
    def holds_only(self) -> bool:
        return self.status == 0

    def matches(self, method: str, path: str) -> bool:
        method_ok = self.method == "*" or self.method.upper() == method.upper()
        return method_ok and fnmatch.fnmatchcase(path, self.path)


class FaultInjector:
    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._random = random.Random(seed)

    def seed(self, seed: int) -> None:
        with self._lock:
            self._random.seed(seed)

    def fail(
        self,
        method: str = "*",
        path: str = "*",
        status: int = 502,
        times: int | None = 1,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        rate: float = 1.0,
    ) -> Fault:
        """The next `times` matching requests get `status` (default: 502 Bad Gateway); with `rate`
        below 1, only that share of them, drawn at random (e.g. `times=None, rate=0.05`: 5 % of all)."""
        fault = Fault(
            method=method,
            path=path,
            status=status,
            body=body if body is not None else {"message": "Server Error"},
            headers=dict(headers or {}),
            remaining=times,
            rate=rate,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def take_hold(self, method: str, path: str) -> Fault | None:
        return self.take(method, path, holds=True)

    def hold(self, method: str = "*", path: str = "*", seconds: float = 10.0, times: int | None = 1) -> Fault:
        """Answer the next `times` matching requests normally, but only after `seconds` (a slow GitHub, or a
        job held at a known point while a test kills its worker)."""
        fault = Fault(method=method, path=path, status=0, body={}, remaining=times, delay=seconds)
        with self._lock:
            self._faults.append(fault)
        return fault

    def secondary_rate_limit(
        self, method: str = "*", path: str = "*", times: int | None = 1, retry_after: int = 1, rate: float = 1.0
    ) -> Fault:
        """403 with GitHub's secondary-rate-limit message and a Retry-After header."""
        return self.fail(
            method,
            path,
            status=403,
            times=times,
            body={"message": SECONDARY_RATE_LIMIT_MESSAGE, "documentation_url": RATE_LIMIT_DOCS},
            headers={"Retry-After": str(retry_after)},
            rate=rate,
        )

    def too_many_requests(
        self, method: str = "*", path: str = "*", times: int | None = 1, retry_after: int = 1
    ) -> Fault:
        """429, which GitHub also uses for secondary rate limits."""
        return self.fail(
            method,
            path,
            status=429,
            times=times,
            body={"message": SECONDARY_RATE_LIMIT_MESSAGE, "documentation_url": RATE_LIMIT_DOCS},
            headers={"Retry-After": str(retry_after)},
        )

    def primary_rate_limit(
        self, method: str = "*", path: str = "*", times: int | None = 1, reset_in: int = 1
    ) -> Fault:
        """403 'API rate limit exceeded' with x-ratelimit-remaining: 0 and a near reset."""
        return self.fail(
            method,
            path,
            status=403,
            times=times,
            body={"message": PRIMARY_RATE_LIMIT_MESSAGE, "documentation_url": RATE_LIMIT_DOCS},
            headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + reset_in)},
        )

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def pending(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def take(self, method: str, path: str, holds: bool = False) -> Fault | None:
        """Consume one use of the first fault matching this request, if any (with ``holds``: of the holds only,
        which the app takes before anything else; without: of the others)."""
        with self._lock:
            for fault in self._faults:
                if fault.holds_only == holds and fault.matches(method, path):
                    if fault.rate < 1.0 and self._random.random() >= fault.rate:
                        continue
                    fault.hits += 1
                    if fault.remaining is not None:
                        fault.remaining -= 1
                        if fault.remaining <= 0:
                            self._faults.remove(fault)
                    return fault
        return None
