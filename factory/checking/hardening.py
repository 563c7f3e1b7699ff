"""Checks of the bundle as written, which the CrossGuard pack cannot make: the pack sees a Secret's
inputs with their secret values unwrapped, so only the rendered files show whether a credential
was written in clear.

`bundle-secrets`: every value of a rendered `Secret`'s `data` and `stringData` is the redaction
placeholder (`factory.model.secrets.REDACTED`: the program marked it secret, and its value lives in
the Pulumi state, encrypted, never in the GitOps bundle). A literal value is a credential committed
with the bundle.

`chart-generated-keys`: no chart renders private key material into its own objects. A key a
chart's template generates (`genCA`, `genPrivateKey`) is written into helm-controller's release
storage with the rest of the release, and a new one replaces it on every upgrade; the platform has
such keys made in the cluster instead (Cilium's certgen job, the operators' own certificate
controllers).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Iterable

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.secrets import REDACTED
from ai_factory.factory.rendering.bundle import Rendered
from ai_factory.factory.rendering.charts import CHART_ORIGIN


def bundle_secrets(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    for m in rendered.of_kind("Secret"):
        if m.obj.get("apiVersion") != "v1":
            continue
        if m.origin.startswith(CHART_ORIGIN):
            continue  # made by the chart at install time (its own certificates), not written in the bundle
        for field in ("data", "stringData"):
            values = m.obj.get(field)
            literal = sorted(str(k) for k, v in values.items() if v != REDACTED) if isinstance(values, Mapping) else []
            if literal:
                yield Finding(
                    "bundle-secrets",
                    m.ref,
                    f"{field} holds {', '.join(literal)} in clear: a Secret's values come from the config's secrets (marked secret, "
                    "so the bundle holds the placeholder) or from OpenBao through an ExternalSecret",
                    (m.tenant,) if m.tenant else (),
                )


PRIVATE_KEY_MARKER = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")


def _holds_private_key(value: object) -> bool:
    """A `data` value (base64) or a `stringData` one (text) holding a PEM private key."""
    if not isinstance(value, str):
        return False
    try:
        decoded = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        decoded = value.encode()
    return bool(PRIVATE_KEY_MARKER.search(decoded))


def chart_generated_keys(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    for m in rendered.of_kind("Secret"):
        if not m.origin.startswith(CHART_ORIGIN):
            continue
        keys = sorted(
            str(k)
            for field in ("data", "stringData")
            if isinstance(values := m.obj.get(field), Mapping)
            for k, v in values.items()
            if _holds_private_key(v)
        )
        if keys:
            yield Finding(
                "chart-generated-keys",
                m.ref,
                f"the chart generates private key(s) {', '.join(keys)} into its release: helm-controller stores them with the release "
                "and replaces them on every upgrade; have them made in the cluster (the chart's job or certificate controller method)",
                (m.tenant,) if m.tenant else (),
            )


CHECKS = [bundle_secrets, chart_generated_keys]
