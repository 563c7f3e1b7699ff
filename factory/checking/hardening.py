"""Checks of the bundle as written, which the CrossGuard pack cannot make: the pack sees a Secret's
inputs with their secret values unwrapped, so only the rendered files show whether a credential
was written in clear.

`bundle-secrets`: every value of a rendered `Secret`'s `data` and `stringData` is the redaction
placeholder (`factory.model.secrets.REDACTED`: the program marked it secret, and its value lives in
the Pulumi state, encrypted, never in the GitOps bundle). A literal value is a credential committed
with the bundle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterable

from ai_factory.factory.checking.findings import Finding
from ai_factory.factory.checking.oracles import Oracles
from ai_factory.factory.model.secrets import REDACTED
from ai_factory.factory.rendering.bundle import Rendered


def bundle_secrets(rendered: Rendered, oracles: Oracles) -> Iterable[Finding]:
    for m in rendered.manifests:
        if m.kind != "Secret" or m.obj.get("apiVersion") != "v1" or not m.stage:
            continue  # a Secret a chart generates at install time (no stage) is not written to the bundle
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


CHECKS = [bundle_secrets]
