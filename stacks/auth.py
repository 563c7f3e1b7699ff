"""OIDC bearer tokens: who is calling, and in which groups.

Tokens are JWTs signed by the platform's issuer (`identity.issuer_url`). Its signing keys come
from the issuer's discovery document (`/.well-known/openid-configuration` -> `jwks_uri`), fetched
on first use, cached, and fetched again when a token names a key the cache does not hold (key
rotation), at most once per `min_refresh_seconds`. A token is accepted only if its signature
verifies with an asymmetric algorithm, its issuer and audience are the expected ones, and it has
not expired (with a small leeway for clock skew).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

import jwt

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric only: a symmetric (HS*) token would be signed with a secret the service would share."""

Fetch = Callable[[str], dict[str, Any]]


class AuthError(Exception):
    """The request carries no acceptable token (HTTP 401). The message never quotes the token."""


class IssuerUnavailable(Exception):
    """The issuer's signing keys cannot be fetched: no token can be verified (HTTP 503)."""


@dataclass(frozen=True)
class Caller:
    subject: str
    groups: frozenset[str]
    admin: bool
    """Member of the platform admin group: may act on every tenant."""

    def may_act_for(self, owner_groups: frozenset[str] | set[str] | list[str]) -> bool:
        return self.admin or bool(self.groups & set(owner_groups))


def fetch_json(url: str) -> dict[str, Any]:
    if not url.startswith("https://"):
        raise IssuerUnavailable(f"refusing to fetch signing keys over anything but https: {url}")
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (https only, checked above)
        return json.loads(response.read())


class Jwks:
    """The issuer's signing keys, cached."""

    def __init__(self, issuer: str, fetch: Fetch = fetch_json, *, ttl_seconds: float = 600, min_refresh_seconds: float = 30, clock: Callable[[], float] = time.monotonic):
        self.issuer = issuer
        self._fetch = fetch
        self._ttl = ttl_seconds
        self._min_refresh = min_refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None

    def key(self, kid: str) -> jwt.PyJWK:
        with self._lock:
            now = self._clock()
            stale = self._fetched_at is None or now - self._fetched_at > self._ttl
            rotated = kid not in self._keys and (self._fetched_at is None or now - self._fetched_at >= self._min_refresh)
            if stale or rotated:
                self._refresh(now)
            if kid not in self._keys:
                raise AuthError(f"the token is signed with key {kid!r}, which the issuer does not publish")
            return self._keys[kid]

    def _refresh(self, now: float) -> None:
        try:
            discovery = self._fetch(self.issuer.rstrip("/") + "/.well-known/openid-configuration")
            if discovery.get("issuer") != self.issuer:
                raise IssuerUnavailable(f"the discovery document of {self.issuer} names another issuer ({discovery.get('issuer')!r})")
            keys = jwt.PyJWKSet.from_dict(self._fetch(discovery["jwks_uri"])).keys
        except (OSError, ValueError, KeyError, jwt.PyJWKSetError) as err:
            raise IssuerUnavailable(f"cannot fetch the signing keys of {self.issuer}: {err}") from None
        self._keys = {k.key_id: k for k in keys if k.key_id and k.public_key_use in (None, "sig")}
        self._fetched_at = now


class TokenVerifier:
    def __init__(self, jwks: Jwks, *, audience: str, admin_group: str, groups_claim: str = "groups", leeway_seconds: int = 30):
        self.jwks = jwks
        self.audience = audience
        self.admin_group = admin_group
        self.groups_claim = groups_claim
        self.leeway = leeway_seconds

    def verify(self, token: str) -> Caller:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise AuthError("the bearer token is not a JWT") from None
        if header.get("alg") not in ALGORITHMS:
            raise AuthError(f"tokens signed with {header.get('alg')!r} are not accepted")
        if not header.get("kid"):
            raise AuthError("the token names no signing key (kid)")
        key = self.jwks.key(header["kid"])
        # The key decides the algorithm (its `alg`, or its type's default), never the token.
        if header["alg"] != key.algorithm_name:
            raise AuthError(f"the token is signed with {header['alg']!r}, but key {header['kid']!r} signs with {key.algorithm_name!r}")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.jwks.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthError(f"the token is not meant for this service (audience {self.audience!r})") from None
        except jwt.InvalidIssuerError:
            raise AuthError(f"the token was not issued by {self.jwks.issuer}") from None
        except jwt.InvalidTokenError as err:
            raise AuthError(f"the token is invalid: {err}") from None
        if not all(isinstance(claims[c], (int, float)) and not isinstance(claims[c], bool) for c in ("exp", "iat")):
            raise AuthError("the token's exp and iat claims must be NumericDates (RFC 7519)")
        groups = claims.get(self.groups_claim) or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise AuthError(f"the token's {self.groups_claim!r} claim is not a list of group names")
        return Caller(subject=claims["sub"], groups=frozenset(groups), admin=self.admin_group in groups)
