"""Secret configuration values.

A `SecretValue` holds a value that came from a `secure:` entry of a stack file (or a secret Pulumi
config key). It never shows its content: `str()`/`repr()` and serialisation print a placeholder,
and components hand it to Pulumi only as `pulumi.Output.secret(...)`, so the engine encrypts it in
state and the offline renderer redacts it.

Offline, a `secure:` entry becomes an opaque placeholder naming the config path, which is all the
offline tools ever need. Its ciphertext is checked for form always, and, when the passphrase is at
hand, for decrypting with it (`PassphraseCrypter`); the plaintext is never kept.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

REDACTED = "[secret]"


class SecretValue:
    """An opaque secret. The only way out is `.reveal()`, used by components to wrap it in a Pulumi secret."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def output(self):
        """The value as a Pulumi secret output: encrypted in state, redacted by the renderer."""
        import pulumi

        return pulumi.Output.secret(self._value)

    def __repr__(self) -> str:
        return f"SecretValue({REDACTED})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretValue) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            _validate_secret,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda _v: REDACTED),
        )


def offline_placeholder(path: str) -> SecretValue:
    """What a `secure:` stack-file entry becomes offline: a stable, content-free stand-in."""
    return SecretValue(f"{REDACTED}:{path}")


def _validate_secret(value: Any, info: core_schema.ValidationInfo) -> SecretValue:
    if isinstance(value, SecretValue):
        return value
    # Inside `pulumi up` the engine hands us decrypted config; it is acceptable only when the
    # top-level key it came from is a secret key (the loader says so through the context).
    if isinstance(value, str) and info.context and info.context.get("plaintext_is_secret"):
        return SecretValue(value)
    raise ValueError(
        "must be a secret: set it with `pulumi config set --secret --path <key>` "
        "(a plain value here would be stored in clear)"
    )


# --------------------------------------------------------------------------- the passphrase secrets manager
#
# Pulumi's `passphrase` secrets provider, as the CLI implements it: the stack file's
# `encryptionsalt` is `v1:<base64 salt>:<the word "pulumi" encrypted>`, the key is PBKDF2-SHA256
# of the passphrase over that salt (1,000,000 iterations, 32 bytes), and every `secure:` value is
# `v1:<base64 12-byte nonce>:<base64 AES-256-GCM ciphertext and tag>`. The offline tools only ever
# ask whether a value decrypts; the plaintext never leaves `PassphraseCrypter.decrypts`.

MAX_SECURE_VALUE_CHARS = 65_536
"""Longest `secure:` ciphertext accepted (a 48 KiB secret)."""
MAX_PASSPHRASE_FILE_BYTES = 65_536
PBKDF2_ITERATIONS = 1_000_000
_GCM_NONCE_BYTES = 12
_GCM_TAG_BYTES = 16
_SALT_CHECK = b"pulumi"


class SecretsError(Exception):
    """A secure value or the stack's salt cannot be used; the message never holds a plaintext."""


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SecretsError(f"{what} is not base64") from None


def parse_ciphertext(value: object) -> tuple[bytes, bytes]:
    """The nonce and ciphertext of a `secure:` value, or `SecretsError` saying why it is malformed."""
    if not isinstance(value, str):
        raise SecretsError(f"must be a ciphertext string from `pulumi config set --secret`, got {type(value).__name__}")
    if len(value) > MAX_SECURE_VALUE_CHARS:
        raise SecretsError(f"ciphertext longer than {MAX_SECURE_VALUE_CHARS} characters")
    version, _, rest = value.partition(":")
    nonce_text, _, body_text = rest.partition(":")
    if version != "v1" or not nonce_text or not body_text:
        raise SecretsError("not a Pulumi ciphertext (`v1:<nonce>:<ciphertext>`)")
    nonce, body = _b64(nonce_text, "its nonce"), _b64(body_text, "its ciphertext")
    if len(nonce) != _GCM_NONCE_BYTES:
        raise SecretsError(f"its nonce is {len(nonce)} bytes, not {_GCM_NONCE_BYTES}")
    if len(body) < _GCM_TAG_BYTES:
        raise SecretsError("its ciphertext is shorter than an AES-GCM tag")
    return nonce, body


def passphrase_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The passphrase as the Pulumi CLI finds it: `PULUMI_CONFIG_PASSPHRASE` (set, even empty), else
    the trimmed content of `PULUMI_CONFIG_PASSPHRASE_FILE`; None when neither is set."""
    env = os.environ if environ is None else environ
    if "PULUMI_CONFIG_PASSPHRASE" in env:
        return env["PULUMI_CONFIG_PASSPHRASE"]
    path = env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            content = handle.read(MAX_PASSPHRASE_FILE_BYTES + 1)
    except OSError as err:
        raise SecretsError(f"PULUMI_CONFIG_PASSPHRASE_FILE: cannot read {path}: {err.strerror}") from None
    if len(content) > MAX_PASSPHRASE_FILE_BYTES:
        raise SecretsError(f"PULUMI_CONFIG_PASSPHRASE_FILE: {path} is larger than {MAX_PASSPHRASE_FILE_BYTES} bytes")
    return content.decode("utf-8", errors="replace").strip()


def parse_salt(value: object) -> tuple[bytes, str]:
    """The salt and the check ciphertext of a stack's `encryptionsalt`, or `SecretsError`."""
    if not isinstance(value, str) or len(value) > MAX_SECURE_VALUE_CHARS:
        raise SecretsError("must be the `v1:<salt>:<check>` string `pulumi stack init` wrote")
    version, _, rest = value.partition(":")
    salt_text, _, check = rest.partition(":")
    if version != "v1" or not salt_text or not check:
        raise SecretsError("not a passphrase salt (`v1:<salt>:<check>`)")
    salt = _b64(salt_text, "its salt")
    parse_ciphertext(check)
    return salt, check


class PassphraseCrypter:
    """The key of a stack's passphrase secrets manager, checked against its `encryptionsalt`."""

    def __init__(self, passphrase: str, encryption_salt: object):
        salt, check = parse_salt(encryption_salt)
        self._key = _derive_key(passphrase.encode(), salt)
        if self._decrypt(check) != _SALT_CHECK:
            raise SecretsError("the passphrase is not this stack's: its encryptionsalt does not decrypt with it")

    def _decrypt(self, value: object) -> bytes | None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce, body = parse_ciphertext(value)
        try:
            return AESGCM(self._key).decrypt(nonce, body, None)
        except InvalidTag:
            return None

    def decrypts(self, value: object) -> bool:
        return self._decrypt(value) is not None


@functools.lru_cache(maxsize=8)
def _derive_key(passphrase: bytes, salt: bytes) -> bytes:
    """Over a second of CPU each: one derivation per (passphrase, salt) and process."""
    return hashlib.pbkdf2_hmac("sha256", passphrase, salt, PBKDF2_ITERATIONS, 32)
