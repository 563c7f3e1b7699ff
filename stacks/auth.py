"""OIDC bearer tokens: who is calling, and in which groups.

Tokens are JWTs signed by the platform's issuer (`identity.issuer_url`). Its signing keys come
from the issuer's discovery document (`/.well-known/openid-configuration` -> `jwks_uri`), read once;
PyJWT's `PyJWKClient` fetches the key set, caches it (`ttl_seconds`) and fetches it again when a
token names a key it does not hold (key rotation), at most once per `min_refresh_seconds`. Both
requests trust the issuer's CA when one is given (`ssl_context`), the system's otherwise. A token
is accepted only if its signature verifies with an asymmetric algorithm, its issuer and audience
are the expected ones, and it has not expired (with a small leeway for clock skew).
"""

from __future__ import annotations

import json
import ssl
import threading
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


def issuer_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """TLS to the issuer: its own CA bundle when given (a private PKI), the system's otherwise.
    Only these requests trust it, not the rest of the process (the `pulumi` CLI included)."""
    return ssl.create_default_context(cafile=ca_file)


def fetch_json(url: str, ssl_context: ssl.SSLContext | None = None) -> dict[str, Any]:
    if not url.startswith("https://"):
        raise IssuerUnavailable(f"refusing to fetch signing keys over anything but https: {url}")
    with urllib.request.urlopen(url, timeout=10, context=ssl_context) as response:  # noqa: S310 (https only, checked above)
        return json.loads(response.read())


class _KeySetClient(jwt.PyJWKClient):
    """PyJWKClient whose key-set request goes through an injected `fetch` (tests, custom transports)."""

    def __init__(self, uri: str, fetch: Fetch, **options: Any):
        super().__init__(uri, **options)
        self._fetch = fetch

    def fetch_data(self) -> Any:
        try:
            data = self._fetch(self.uri)
        except OSError as err:
            raise jwt.PyJWKClientConnectionError(str(err)) from err
        if self.jwk_set_cache is not None:
            self.jwk_set_cache.put(data)
        return data


class Jwks:
    """The issuer's signing keys. `fetch`: how the discovery document (and, when given, the key
    set) is read; by default HTTPS with `ssl_context`."""

    def __init__(
        self,
        issuer: str,
        fetch: Fetch | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        ttl_seconds: float = 600,
        min_refresh_seconds: float = 30,
    ):
        self.issuer = issuer
        self._fetch = fetch
        self._ssl_context = ssl_context
        self._options = {"cache_jwk_set": True, "lifespan": ttl_seconds, "cooldown_duration": min_refresh_seconds, "timeout": 10, "ssl_context": ssl_context}
        self._lock = threading.Lock()
        self._client: jwt.PyJWKClient | None = None

    def key(self, kid: str) -> jwt.PyJWK:
        try:
            return self._keys().get_signing_key(kid)
        except jwt.PyJWKClientConnectionError as err:
            raise IssuerUnavailable(f"cannot fetch the signing keys of {self.issuer}: {err}") from None
        except (jwt.PyJWKClientError, jwt.PyJWKSetError) as err:
            if "Unable to find a signing key" in str(err):
                raise AuthError(f"the token is signed with key {kid!r}, which the issuer does not publish") from None
            raise IssuerUnavailable(f"cannot fetch the signing keys of {self.issuer}: {err}") from None

    def _keys(self) -> jwt.PyJWKClient:
        with self._lock:
            if self._client is None:
                discovery = self._discovery()
                uri = discovery.get("jwks_uri")
                if not isinstance(uri, str) or not uri.startswith("https://"):
                    raise IssuerUnavailable(f"the discovery document of {self.issuer} names no https jwks_uri ({uri!r})")
                self._client = _KeySetClient(uri, self._fetch, **self._options) if self._fetch else jwt.PyJWKClient(uri, **self._options)
            return self._client

    def _discovery(self) -> dict[str, Any]:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            discovery = self._fetch(url) if self._fetch else fetch_json(url, self._ssl_context)
        except (OSError, ValueError) as err:
            raise IssuerUnavailable(f"cannot fetch the signing keys of {self.issuer}: {err}") from None
        if not isinstance(discovery, dict) or discovery.get("issuer") != self.issuer:
            raise IssuerUnavailable(f"the discovery document of {self.issuer} names another issuer ({discovery.get('issuer') if isinstance(discovery, dict) else None!r})")
        return discovery


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
