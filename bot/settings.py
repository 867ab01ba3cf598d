"""Process settings from the environment, validated at start with messages naming the variable."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional


class SettingsError(ValueError):
    """One or more settings are missing or invalid; ``problems`` lists each, and the message all of them."""

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} settings are missing or invalid:\n" + "\n".join(
                f"  - {problem}" for problem in self.problems)
        super().__init__(message)


DEFAULT_API_URL = "https://api.github.com"
DEFAULT_WEBHOOK_PATH = "/api/github/webhooks"
# GitHub caps payloads at 25 MB, but the events the App handles are far smaller: their free text is a PR's or
# an issue's body and a comment (65,536 characters each, at most 12 bytes each JSON-escaped: 1.5 MiB) and a
# commit's message, around objects of a few KiB (repository, users, labels). Every request body is held in
# memory whole while its signature is checked, so the cap bounds the web's memory: 32 threads x 5 MiB.
MAX_WEBHOOK_BYTES = 5 * 1024 * 1024
DEFAULT_DELIVERY_TTL_DAYS = 30


@dataclass(frozen=True)
class Settings:
    app_id: Optional[int]
    private_key: Optional[str]
    webhook_secret: Optional[str]
    api_url: str = DEFAULT_API_URL
    redis_url: Optional[str] = None
    data_dir: Path = Path(".torchreview-data")
    webhook_path: str = DEFAULT_WEBHOOK_PATH
    port: int = 3000
    # /healthz and /metrics on a port of their own, for the internal network only (None: on ``port``)
    internal_port: Optional[int] = None
    bot_login: Optional[str] = None  # our own bot account (``<slug>[bot]``), to ignore our comments
    # GitHub asks integrators to space content-creating requests by about a second.
    github_write_interval: float = 1.0
    # How long a delivery's id and signed body are remembered (one short Redis key each). GitHub keeps
    # deliveries for redelivery, by hand or through its API, for longer than the few days it retries, and a
    # signature carries no timestamp: a captured body replayed after this is taken as new. 30 days by default.
    delivery_ttl_s: int = DEFAULT_DELIVERY_TTL_DAYS * 24 * 3600

    @property
    def broker_url(self) -> str:
        if self.redis_url:
            return self.redis_url
        return f"sqla+sqlite:///{(self.data_dir / 'broker.sqlite').resolve()}"

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, *, require_github: bool = True,
                 role: str = "all") -> "Settings":
        """``role``: ``web`` needs the webhook secret and never reads the private key; ``worker``
        needs the key, not the secret; ``all`` (one process doing both) needs both."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        env = os.environ if env is None else env
        problems: list[str] = []  # every one of them at once: an operator fixes them in one go

        def check(validate, *args):
            try:
                return validate(*args)
            except SettingsError as exc:
                problems.extend(exc.problems)
                return None

        app_id = env.get("GITHUB_APP_ID", "").strip()
        secret = env.get("GITHUB_WEBHOOK_SECRET", "") if role != "worker" else ""
        key = env.get("GITHUB_PRIVATE_KEY", "") if role != "web" else ""
        key_path = env.get("GITHUB_PRIVATE_KEY_PATH", "").strip() if role != "web" else ""
        key_unreadable = False
        if not key and key_path:
            try:
                key = Path(key_path).read_text()
            except OSError as exc:
                problems.append(f"GITHUB_PRIVATE_KEY_PATH: cannot read {key_path}: {exc.strerror or exc}")
                key_unreadable = True
        key = key.replace("\\n", "\n").strip()
        if require_github:
            if not app_id:
                problems.append("GITHUB_APP_ID is not set (the numeric id of your GitHub App)")
            if not key and role != "web" and not key_unreadable:
                problems.append("GITHUB_PRIVATE_KEY or GITHUB_PRIVATE_KEY_PATH must be set (the App's PEM key)")
            if not secret and role != "worker":
                problems.append("GITHUB_WEBHOOK_SECRET is not set (the secret configured on the App's webhook)")
        if secret and require_github:
            check(check_webhook_secret, secret)
        if app_id and not app_id.isdigit():
            problems.append(f"GITHUB_APP_ID must be a number, got {app_id!r}")
        if key and "PRIVATE KEY" not in key:
            problems.append("GITHUB_PRIVATE_KEY does not look like a PEM private key (-----BEGIN ... PRIVATE KEY-----)")
        elif key:
            check(_check_key, key)
        api_url = env.get("GITHUB_API_URL", DEFAULT_API_URL).strip().rstrip("/") or DEFAULT_API_URL
        if not api_url.startswith(("http://", "https://")):
            problems.append(f"GITHUB_API_URL must be an http(s) URL, got {api_url!r}")
        path = env.get("TORCHREVIEW_WEBHOOK_PATH", DEFAULT_WEBHOOK_PATH).strip() or DEFAULT_WEBHOOK_PATH
        if not path.startswith("/"):
            problems.append(f"TORCHREVIEW_WEBHOOK_PATH must start with '/', got {path!r}")
        port = check(port_number, env, "PORT", "3000")
        internal_port = None
        if env.get(INTERNAL_PORT_ENV, "").strip() and role != "worker":
            internal_port = check(port_number, env, INTERNAL_PORT_ENV, "")
            if internal_port is not None and internal_port in (port, 0):
                problems.append(f"{INTERNAL_PORT_ENV} must be a port other than PORT ({port}) and 0, "
                                f"got {internal_port}")
        interval = env.get("TORCHREVIEW_GITHUB_WRITE_INTERVAL", "1.0").strip()
        try:
            write_interval = float(interval)
        except ValueError:
            problems.append(f"TORCHREVIEW_GITHUB_WRITE_INTERVAL must be a number of seconds, got {interval!r}")
        ttl_days = env.get("TORCHREVIEW_DELIVERY_TTL_DAYS", str(DEFAULT_DELIVERY_TTL_DAYS)).strip()
        if not ttl_days.isdigit() or not 1 <= int(ttl_days) <= 365:
            problems.append(f"TORCHREVIEW_DELIVERY_TTL_DAYS must be a whole number of days from 1 to 365, got {ttl_days!r}")
        redis_url = env.get("REDIS_URL", "").strip() or None
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"REDIS_URL must be a redis:// URL, got {redis_url!r}")
        if require_github:  # a start, not a process asking only for the broker
            problems.extend(_process_problems(env, role))
        if problems:
            raise SettingsError(problems)
        return cls(
            app_id=int(app_id) if app_id else None,
            private_key=key or None,
            webhook_secret=secret or None,
            api_url=api_url,
            redis_url=redis_url,
            data_dir=Path(env.get("TORCHREVIEW_DATA_DIR", ".torchreview-data")),
            webhook_path=path,
            port=port,
            internal_port=internal_port,
            bot_login=env.get("TORCHREVIEW_BOT_LOGIN") or None,
            github_write_interval=write_interval,
            delivery_ttl_s=int(ttl_days) * 24 * 3600,
        )


INTERNAL_PORT_ENV = "TORCHREVIEW_INTERNAL_PORT"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def port_number(env: Mapping[str, str], name: str, default: str) -> int:
    value = env.get(name, default).strip()
    if not value.isdigit() or int(value) > 65535:
        raise SettingsError(f"{name} must be a port number, got {value!r}")
    return int(value)


def _process_problems(env: Mapping[str, str], role: str) -> list[str]:
    """The other variables torchreview's processes read at start (logging, the queue, the workers)."""
    problems = []
    level = env.get("LOG_LEVEL", "INFO").strip().upper()
    if level not in LOG_LEVELS:
        problems.append(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {env.get('LOG_LEVEL')!r}")
    visibility = env.get("TORCHREVIEW_VISIBILITY_TIMEOUT", "900").strip()
    if not visibility.isdigit() or int(visibility) < 1:
        problems.append(f"TORCHREVIEW_VISIBILITY_TIMEOUT must be a whole number of seconds, got {visibility!r}")
    if role != "web":
        try:
            port_number(env, "TORCHREVIEW_WORKER_METRICS_PORT", "9191")
        except SettingsError as exc:
            problems.append(f"{exc} (0: no metrics port)")
        executor = env.get("TORCHREVIEW_EXECUTOR_URL", "").strip()
        if executor and not executor.startswith(("http://", "https://")):
            problems.append(f"TORCHREVIEW_EXECUTOR_URL must be an http(s) URL, got {executor!r}")
    return problems


ROLES = ("all", "web", "worker")
MIN_SECRET_LENGTH = 16
# Template and example values (ours included), compared without case or punctuation: a deployment
# that kept one accepts forged deliveries.
PLACEHOLDER_SECRETS = {"secret", "webhooksecret", "githubwebhooksecret", "yoursecret", "yourwebhooksecret",
                       "mysecret", "development", "developmentsecret", "password", "test", "example"}
PLACEHOLDER_PHRASES = ("changeme", "changethis", "replaceme", "replacethis")


def check_webhook_secret(secret: str) -> None:
    """Refuse secrets that anyone could guess: every delivery's authenticity rests on this one value.

    The messages never echo the value: it may be a real secret that merely looks weak."""
    hint = "set GITHUB_WEBHOOK_SECRET to a long random string (openssl rand -hex 32) on the App and here"
    letters = re.sub(r"[^a-z0-9]", "", secret.lower())
    if letters in PLACEHOLDER_SECRETS or any(phrase in letters for phrase in PLACEHOLDER_PHRASES):
        raise SettingsError(f"GITHUB_WEBHOOK_SECRET is a placeholder value; {hint}")
    if len(secret) < MIN_SECRET_LENGTH or len(set(secret)) < 4:
        raise SettingsError(f"GITHUB_WEBHOOK_SECRET is too weak (fewer than {MIN_SECRET_LENGTH} characters or "
                            f"hardly any distinct ones); {hint}")


def _check_key(pem: str) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        load_pem_private_key(pem.encode(), password=None)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the same user error
        raise SettingsError(f"GITHUB_PRIVATE_KEY is not a readable PEM private key: {exc}") from None
