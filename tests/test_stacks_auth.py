"""OIDC bearer tokens, verified against an issuer's keys made on the spot (no network)."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import ssl
import threading
import time

import jwt
import jwt.jwk_set_cache
import jwt.jwks_client
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from ai_factory.stacks.auth import AuthError, IssuerUnavailable, Jwks, TokenVerifier, issuer_ssl_context
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


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """PyJWT's key-set cache and refresh cooldown, on a clock the test moves."""
    fake = Clock()
    monkeypatch.setattr(jwt.jwks_client.time, "monotonic", fake)
    monkeypatch.setattr(jwt.jwk_set_cache.time, "monotonic", fake)
    return fake


def verifier(issuer: Issuer) -> TokenVerifier:
    return TokenVerifier(Jwks(ISSUER, issuer.fetch), audience=AUDIENCE, admin_group="platform-admins")


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


def test_a_rotated_key_is_fetched_but_unknown_keys_do_not_hammer_the_issuer(clock):
    issuer = Issuer()
    v = verifier(issuer)
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


def _certificate(subject: str, key, issuer_name, issuer_key, *, ca: bool):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture
def private_issuer(tmp_path):
    """A real HTTPS issuer on loopback whose certificate chains to a private CA."""
    ca_key, server_key = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    ca = _certificate("ai-factory test CA", ca_key, None, ca_key, ca=True)
    server = _certificate("127.0.0.1", server_key, ca.subject, ca_key, ca=False)
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.key").write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    documents: dict[str, dict] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(documents.get(self.path, {})).encode()
            self.send_response(200 if self.path in documents else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    url = f"https://127.0.0.1:{httpd.server_address[1]}/realms/lab"
    documents["/realms/lab/.well-known/openid-configuration"] = {"issuer": url, "jwks_uri": f"{url}/certs"}
    documents["/realms/lab/certs"] = {"keys": [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key())), "kid": "lab-1", "use": "sig", "alg": "RS256"}]}
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    now = int(time.time())
    token = jwt.encode({"iss": url, "aud": AUDIENCE, "sub": "ana", "iat": now, "exp": now + 300, "groups": ["lab-admins"]}, signing_key, algorithm="RS256", headers={"kid": "lab-1"})
    yield url, tmp_path / "ca.pem", token
    httpd.shutdown()


def test_an_issuer_behind_a_private_ca_is_trusted_through_its_ca_bundle_only(private_issuer):
    url, ca_file, token = private_issuer
    trusted = TokenVerifier(Jwks(url, ssl_context=issuer_ssl_context(str(ca_file))), audience=AUDIENCE, admin_group="a")
    assert trusted.verify(token).groups == frozenset({"lab-admins"})
    system_only = TokenVerifier(Jwks(url, ssl_context=issuer_ssl_context(None)), audience=AUDIENCE, admin_group="a")
    with pytest.raises(IssuerUnavailable, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        system_only.verify(token)
