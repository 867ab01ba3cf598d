"""The App's webhook as GitHub runs it: deliveries sent to the App's URL, and the log of every attempt.

GitHub keeps each attempt (its "Recent Deliveries"): the event's ``guid`` (the X-GitHub-Delivery header,
shared by every redelivery of the event) and the attempt's own ``id``, status and response. A delivery
the App did not accept is not retried by GitHub; the App redelivers it through
``POST /app/hook/deliveries/{id}/attempts``, which answers 202 and sends it again afterwards.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import requests

from .webhooks import signed_delivery

DELIVERY_TIMEOUT_S = 10  # GitHub gives up on a delivery after 10 seconds


@dataclass
class HookDelivery:
    """One attempt at delivering one event."""

    id: int
    guid: str
    event: str
    action: Optional[str]
    installation_id: Optional[int]
    repository_id: Optional[int]
    url: str
    redelivery: bool
    request_headers: dict[str, str]
    body: bytes
    delivered_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    duration: float = 0.0
    status: str = "pending"
    status_code: int = 0  # 0: no HTTP response at all (refused, timed out)
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: Optional[str] = None

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status_code < 300


class AppWebhook:
    """Where the App's events go (``configure``), and every attempt made (``deliveries``, oldest first)."""

    def __init__(self, lock: threading.RLock, next_id: Callable[[], int]) -> None:
        self._lock = lock
        self._next_id = next_id
        self.url: Optional[str] = None
        self.secret: Optional[str] = None
        self.deliveries: list[HookDelivery] = []
        self._pending: list[threading.Thread] = []

    def configure(self, url: str, secret: str) -> None:
        self.url, self.secret = url, secret

    def deliver(self, event: str, payload: dict[str, Any], guid: Optional[str] = None) -> HookDelivery:
        """Send an event now, as GitHub does when it happens; the attempt is logged whatever its outcome."""
        if self.url is None or self.secret is None:
            raise RuntimeError("the App's webhook is not configured: call configure(url, secret) first")
        body, headers = signed_delivery(event, payload, self.secret, guid or str(uuid.uuid4()))
        installation = (payload.get("installation") or {}).get("id")
        repository = (payload.get("repository") or {}).get("id")
        attempt = HookDelivery(id=self._next_id(), guid=headers["X-GitHub-Delivery"], event=event,
                               action=payload.get("action"), installation_id=installation,
                               repository_id=repository, url=self.url, redelivery=False,
                               request_headers=headers, body=body)
        return self._send(attempt)

    def redeliver_later(self, delivery_id: int) -> Optional[HookDelivery]:
        """What ``POST .../attempts`` does: the same event and bytes, sent again after the 202."""
        original = self.get(delivery_id)
        if original is None:
            return None
        attempt = HookDelivery(id=self._next_id(), guid=original.guid, event=original.event,
                               action=original.action, installation_id=original.installation_id,
                               repository_id=original.repository_id, url=self.url or original.url,
                               redelivery=True, request_headers=dict(original.request_headers), body=original.body)
        sender = threading.Thread(target=self._send, args=(attempt,), name=f"redeliver-{delivery_id}", daemon=True)
        with self._lock:
            self._pending.append(sender)
        sender.start()
        return original

    def wait_for_redeliveries(self, timeout: float = 30.0) -> None:
        """Tests: until every redelivery asked for so far has been attempted."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pending, self._pending = self._pending, []
        for sender in pending:
            sender.join(max(0.0, deadline - time.monotonic()))
            if sender.is_alive():
                raise TimeoutError(f"a redelivery was still being sent after {timeout:.0f}s")

    def get(self, delivery_id: int) -> Optional[HookDelivery]:
        with self._lock:
            return next((d for d in self.deliveries if d.id == delivery_id), None)

    def newest_first(self) -> list[HookDelivery]:
        with self._lock:
            return sorted(self.deliveries, key=lambda d: d.id, reverse=True)

    def attempts_of(self, guid: str) -> list[HookDelivery]:
        with self._lock:
            return [d for d in self.deliveries if d.guid == guid]

    def _send(self, attempt: HookDelivery) -> HookDelivery:
        started = time.perf_counter()
        attempt.delivered_at = datetime.now(timezone.utc)
        try:  # not under the lock: the App may call the emulator while it answers
            response = requests.post(attempt.url, data=attempt.body, headers=attempt.request_headers,
                                     timeout=DELIVERY_TIMEOUT_S, allow_redirects=False)
        except requests.Timeout:
            attempt.status = "timed out"
        except requests.ConnectionError:
            attempt.status = "failed to connect"
        else:
            attempt.status_code = response.status_code
            attempt.status = "OK" if attempt.succeeded else f"Invalid HTTP Response: {response.status_code}"
            attempt.response_headers = dict(response.headers)
            attempt.response_body = response.text
        attempt.duration = round(time.perf_counter() - started, 3)
        with self._lock:
            self.deliveries.append(attempt)
        return attempt
