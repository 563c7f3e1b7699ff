"""OIDC bearer tokens, verified against an issuer's keys made on the spot (no network)."""

from __future__ import annotations

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from ai_factory.stacks.auth import AuthError, IssuerUnavailable, Jwks, TokenVerifier
from tests.stacks_support import AUDIENCE, ISSUER, Issuer

DISCOVERY = f"{ISSUER}/.well-known/openid-configuration"


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _claims() -> dict:
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "iat": now, "exp": now + 300, "groups": ["platform-admins"]}


def verifier(issuer: Issuer, clock: Clock | None = None) -> TokenVerifier:
    jwks = Jwks(ISSUER, issuer.fetch, clock=clock or Clock())
    return TokenVerifier(jwks, audience=AUDIENCE, admin_group="platform-admins")


def test_a_valid_token_names_the_caller_and_its_groups(issuer):
    caller = verifier(issuer).verify(issuer.token(["search-admins"], sub="ana"))
    assert (caller.subject, caller.groups, caller.admin) == ("ana", frozenset({"search-admins"}), False)
    assert verifier(issuer).verify(issuer.token(["platform-admins"])).admin is True


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda i: i.token(["g"], expires_in=-120), "the token has expired"),
        (lambda i: i.token(["g"], audience="kubernetes"), "not meant for this service"),
        (lambda i: i.token(["g"], issuer="https://sso.evil.example.com/realms/ai-factory"), "was not issued by"),
        (lambda i: i.token(["g"], key=rsa.generate_private_key(public_exponent=65537, key_size=2048)), "Signature verification failed"),
        (lambda i: jwt.encode({"sub": "x", "groups": ["platform-admins"]}, "a-shared-secret-of-at-least-32-bytes", algorithm="HS256", headers={"kid": i.kid}), "'HS256' are not accepted"),
        (lambda i: i.token(["g"], kid="key-unknown", key=i.keys[i.kid]), "which the issuer does not publish"),
        (lambda i: "not-a-jwt", "not a JWT"),
        (lambda i: jwt.encode(_claims(), i.keys[i.kid], algorithm="PS256", headers={"kid": i.kid}), "key 'key-1' signs with 'RS256'"),
        (lambda i: jwt.encode({**_claims(), "exp": str(_claims()["exp"])}, i.keys[i.kid], algorithm="RS256", headers={"kid": i.kid}), "must be NumericDates"),
    ],
    ids=["expired", "wrong-audience", "wrong-issuer", "forged-signature", "symmetric", "unknown-key", "garbage", "algorithm-not-the-keys", "string-exp"],
)
def test_a_bad_token_is_refused_with_the_reason(issuer, make, message):
    with pytest.raises(AuthError, match=message):
        verifier(issuer).verify(make(issuer))


def test_signing_keys_are_fetched_once_and_cached(issuer):
    issuer.fetches.clear()
    v = verifier(issuer)
    for _ in range(3):
        v.verify(issuer.token(["g"]))
    assert issuer.fetches == [DISCOVERY, f"{ISSUER}/protocol/openid-connect/certs"]


def test_a_rotated_key_is_fetched_but_unknown_keys_do_not_hammer_the_issuer():
    issuer, clock = Issuer(), Clock()
    v = verifier(issuer, clock)
    v.verify(issuer.token(["g"]))
    clock.now += 60
    issuer.rotate("key-2")
    assert v.verify(issuer.token(["g"])).subject == "user-1"  # new kid: fetched again
    fetched = len(issuer.fetches)
    for _ in range(5):
        with pytest.raises(AuthError):
            v.verify(issuer.token(["g"], kid="key-3", key=issuer.keys["key-2"]))
    assert len(issuer.fetches) == fetched  # within the refresh interval: no new fetch


def test_a_discovery_document_of_another_issuer_is_refused():
    issuer = Issuer()
    v = TokenVerifier(Jwks(ISSUER, lambda url: {"issuer": "https://elsewhere.example.com", "jwks_uri": "x"}), audience=AUDIENCE, admin_group="a")
    with pytest.raises(IssuerUnavailable, match="names another issuer"):
        v.verify(issuer.token(["g"]))


def test_an_unreachable_issuer_is_unavailable_not_a_bad_token():
    def offline(url):
        raise OSError("connection refused")

    v = TokenVerifier(Jwks(ISSUER, offline), audience=AUDIENCE, admin_group="a")
    with pytest.raises(IssuerUnavailable, match="cannot fetch the signing keys of .*: connection refused"):
        v.verify(Issuer().token(["g"]))
