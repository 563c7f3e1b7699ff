"""Secret configuration values.

A `SecretValue` holds a value that came from a `secure:` entry of a stack file (or a secret Pulumi
config key). It never shows its content: `str()`/`repr()` and serialisation print a placeholder,
and components hand it to Pulumi only as `pulumi.Output.secret(...)`, so the engine encrypts it in
state and the offline renderer redacts it.

Offline, the ciphertext of a `secure:` entry cannot be decrypted (no passphrase, no CLI); the value
becomes an opaque placeholder naming the config path, which is all the offline tools ever need.
"""

from __future__ import annotations

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
