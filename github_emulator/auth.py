"""GitHub App authentication: app JWTs (RS256) and installation tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from .state import PERMISSION_RANK, App, EmulatorState, Installation, InstallationToken, Repository

# GitHub rejects app JWTs that live longer than 10 minutes.
MAX_JWT_LIFETIME_S = 600
# Tolerated clock drift; PyGithub back-dates `iat` by 60 s for exactly this reason.
CLOCK_SKEW_S = 60


class AuthError(Exception):
    """401 with GitHub's message."""


def generate_app_key(bits: int = 2048) -> tuple[str, bytes]:
    """A fresh RSA key pair for a test/demo app: (private PEM str, public PEM bytes)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def credentials(authorization: str | None) -> str | None:
    """The credential of a `token X` / `Bearer X` Authorization header."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() not in ("token", "bearer") or not value.strip():
        return None
    return value.strip()


def verify_app_jwt(encoded: str | None, app: App) -> None:
    """Check a JWT the way GitHub does for app-level endpoints; raise AuthError if bad."""
    if encoded is None:
        raise AuthError("A JSON web token could not be decoded")
    try:
        claims = jwt.decode(
            encoded,
            app.public_key_pem,
            algorithms=["RS256"],
            options={"require": ["iat", "exp", "iss"], "verify_iat": False},
            leeway=CLOCK_SKEW_S,
        )
    except jwt.ExpiredSignatureError:
        raise AuthError(
            "'Expiration time' claim ('exp') must be a numeric value representing the future time "
            "at which the assertion expires"
        ) from None
    except jwt.PyJWTError:
        raise AuthError("A JSON web token could not be decoded") from None
    if str(claims["iss"]) != str(app.id):
        raise AuthError("'Issuer' claim ('iss') must be an Integer")
    now = time.time()
    if claims["iat"] > now + CLOCK_SKEW_S:
        raise AuthError(
            "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
        )
    if claims["exp"] - claims["iat"] > MAX_JWT_LIFETIME_S + CLOCK_SKEW_S:
        raise AuthError("'Expiration time' claim ('exp') is too far in the future")


@dataclass(frozen=True)
class InstallationPrincipal:
    """Who an installation-token request acts as."""

    token: InstallationToken
    installation: Installation

    def can_access(self, repo: Repository) -> bool:
        if not self.installation.covers(repo):
            return False
        return self.token.repository_names is None or repo.full_name in self.token.repository_names

    @property
    def app(self) -> App | None:
        """The App the token acts for (None: the emulated one)."""
        return self.token.app

    def has_permission(self, permission: str, level: str) -> bool:
        granted = self.token.permissions.get(permission, "none")
        return PERMISSION_RANK[granted] >= PERMISSION_RANK[level]


def installation_principal(state: EmulatorState, encoded: str | None) -> InstallationPrincipal:
    """The installation behind a token; AuthError('Bad credentials') if unknown or expired."""
    token = state.tokens.get(encoded or "")
    if token is None or token.expires_at <= datetime.now(timezone.utc):
        raise AuthError("Bad credentials")
    installation = state.installations.get(token.installation_id) or state.other_installations.get(token.installation_id)
    if installation is None:
        raise AuthError("Bad credentials")
    return InstallationPrincipal(token, installation)
