"""Validate what the library emits against upstream "oracle" files.

The oracle directory (see `locate_upstream_dir`) holds, per product, the upstream CRDs, Helm
`Chart.yaml`/`values.yaml`/`values.schema.json` and examples; its README describes the layout.
Three checks use it:

* custom resources against the openAPIV3Schema of the CRD that serves their group/version/kind,
  translated from Kubernetes structural-schema dialect to JSON Schema (see `_translate`);
* built-in Kubernetes objects against the strict schemas shipped by `kubernetes-validate`;
* Helm values against the chart's `values.schema.json` (when upstream ships one) and against the
  key paths of its default `values.yaml` (see `Oracles.validate_values`).

Every error is one string that locates itself: the object (`Kind/namespace/name`) or chart folder,
then the JSON path of the offending field, then what is wrong, e.g.
`ClusterPolicy/cluster-policy: spec.toolkit.enabeld: unknown field`.

Not checked: CEL rules (`x-kubernetes-validations`), list uniqueness (`x-kubernetes-list-type`
set/map), `format`, and the few Go RE2 patterns Python's `re` cannot compile (such as `\\PC`).
This module imports no Pulumi code.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema
import kubernetes_validate
import yaml
from jsonschema.protocols import Validator
import referencing.exceptions
from referencing import Registry, Resource

from ai_factory.factory.model.bounded_yaml import LOADER

FieldPath = tuple[Any, ...]
"""A JSON path as keys and list indices, e.g. ("spec", "resourceGroups", 0, "flavors")."""


class OracleError(Exception):
    """The oracle directory, or a file in it that a check needs, is missing or unreadable."""


def locate_upstream_dir() -> pathlib.Path | None:
    """The oracle directory: $FACTORY_UPSTREAM_DIR if set (it must exist), else
    `<project dir>/../shared/upstream` if it exists (the layout of this repository's checkout),
    else None."""
    configured = os.environ.get("FACTORY_UPSTREAM_DIR")
    if configured:
        path = pathlib.Path(configured)
        if not path.is_dir():
            raise OracleError(f"FACTORY_UPSTREAM_DIR={configured} is not a directory")
        return path
    default = pathlib.Path.cwd().resolve().parent / "shared" / "upstream"
    return default if default.is_dir() else None


# --------------------------------------------------------------------------------------------
# Error wording shared by all checks
# --------------------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_$][A-Za-z0-9_$-]*$")
_MAX_MESSAGE_LENGTH = 240


def _format_path(parts: Iterable[Any]) -> str:
    """`spec.resourceGroups[0].flavors`; keys that are not plain words are quoted:
    `metadata.labels["app.kubernetes.io/name"]`."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f"[{json.dumps(str(part))}]"
    return text or "(root)"


def _json_type(value: Any) -> str:
    """The JSON Schema name of a value's type, as used in "expected object, got string"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def _expected_types(types: Iterable[str]) -> str:
    # Every built-in Kubernetes type is nullable in kubernetes-validate's schemas; naming "null"
    # in each message would only add noise.
    names = list(dict.fromkeys(types))
    shown = [name for name in names if name != "null"] or names
    return " or ".join(shown)


def _unexpected_keys(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    known = schema.get("properties") or {}
    patterns = list((schema.get("patternProperties") or {}).keys())
    return [
        key for key in instance if key not in known and not any(re.search(pattern, key) for pattern in patterns)
    ]


def _describe(error: jsonschema.ValidationError) -> Iterator[tuple[FieldPath, str]]:
    """(path, message) pairs for one jsonschema error, worded like Kubernetes field errors."""
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False:
        for key in _unexpected_keys(error.instance, error.schema):
            yield (*path, key), "unknown field"
    elif error.validator == "required" and isinstance(error.instance, Mapping):
        for name in error.validator_value:
            if name not in error.instance:
                yield (*path, name), "required field missing"
    elif error.validator == "type":
        expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        yield path, f"expected {_expected_types(expected)}, got {_json_type(error.instance)}"
    elif error.validator == "enum":
        yield path, _shorten(f"{error.instance!r} is not one of {error.validator_value!r}")
    elif error.validator in ("anyOf", "oneOf") and error.context:
        alternatives = error.context
        if all(sub.validator == "type" and not sub.relative_path for sub in alternatives):
            expected = [
                name
                for sub in alternatives
                for name in (sub.validator_value if isinstance(sub.validator_value, list) else [sub.validator_value])
            ]
            yield path, f"expected {_expected_types(expected)}, got {_json_type(error.instance)}"
        else:
            closest = jsonschema.exceptions.best_match(alternatives)
            for closest_path, closest_message in _describe(closest):
                yield path, _shorten(
                    f"matches none of the {len(error.validator_value)} allowed alternatives; "
                    f"closest: {_format_path(closest_path)}: {closest_message}"
                )
    elif error.validator == "oneOf":
        yield path, "matches more than one of the allowed alternatives"
    else:
        yield path, _shorten(error.message)


def _shorten(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE_LENGTH else message[: _MAX_MESSAGE_LENGTH - 1] + "…"


def _problems(errors: Iterable[jsonschema.ValidationError], path_prefix: FieldPath = ()) -> set[tuple[FieldPath, str]]:
    return {((*path_prefix, *path), message) for error in errors for path, message in _describe(error)}


def _error_lines(prefix: str, problems: Iterable[tuple[FieldPath, str]]) -> list[str]:
    return sorted({f"{prefix}: {_format_path(path)}: {message}" for path, message in problems})


def _object_identity(obj: Mapping[str, Any]) -> str:
    """`Kind/namespace/name`, or `Kind/name` for cluster-scoped objects."""
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    parts = [str(obj.get("kind") or "<no kind>")]
    if metadata.get("namespace"):
        parts.append(str(metadata["namespace"]))
    parts.append(str(metadata.get("name") or "<no name>"))
    return "/".join(parts)


def _split_api_version(api_version: str) -> tuple[str, str]:
    """("rbac.authorization.k8s.io", "v1") for "rbac.authorization.k8s.io/v1"; ("", "v1") for "v1"."""
    group, _, version = api_version.rpartition("/")
    return group, version


# --------------------------------------------------------------------------------------------
# Built-in Kubernetes objects (kubernetes-validate schemas)
# --------------------------------------------------------------------------------------------

_KUBERNETES_SCHEMA_ROOT = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
_STRICT_SCHEMA_DIR = re.compile(r"^v(\d+)\.(\d+)\.\d+-local-strict$")
_API_GROUP = re.compile(r"^[a-z0-9.-]*$")
_KUBERNETES_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


@functools.cache
def _strict_schema_dirs() -> dict[tuple[int, int], pathlib.Path]:
    """kubernetes-validate's strict schema folders (unknown fields rejected) by (major, minor)."""
    dirs = {}
    for child in _KUBERNETES_SCHEMA_ROOT.iterdir():
        match = _STRICT_SCHEMA_DIR.match(child.name)
        if match:
            dirs[(int(match[1]), int(match[2]))] = child
    return dirs


def _strict_schema_dir(kubernetes_version: str) -> pathlib.Path:
    """The schema folder for "1.34", "1.34.0" or "v1.34.2" (schemas are per minor release)."""
    match = _KUBERNETES_VERSION.match(kubernetes_version.strip())
    if not match:
        raise ValueError(f"not a Kubernetes version: {kubernetes_version!r} (expected e.g. '1.34' or '1.34.0')")
    wanted = (int(match[1]), int(match[2]))
    dirs = _strict_schema_dirs()
    if wanted not in dirs:
        covered = ", ".join(f"{major}.{minor}" for major, minor in sorted(dirs))
        raise ValueError(
            f"kubernetes-validate {kubernetes_validate.__version__} has no schemas for Kubernetes "
            f"{wanted[0]}.{wanted[1]} (it covers {covered})"
        )
    return dirs[wanted]


@functools.cache
def _core_definitions(schema_dir: pathlib.Path) -> dict[str, Any]:
    return json.loads((schema_dir / "_definitions.json").read_text(encoding="utf-8"))


@functools.cache
def _core_registry(schema_dir: pathlib.Path) -> Registry:
    definitions = _core_definitions(schema_dir)
    return Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))


@functools.cache
def _core_validator(schema_dir: pathlib.Path, api_version: str, kind: str) -> Validator | None:
    """The validator for one built-in kind, or None when this Kubernetes release does not serve it.

    Schema files are named `<kind>-<first label of the group>-<version>.json`; they also exist for
    nested types (core/v1 "ResourceClaim" is a pod field), so the file must declare this exact
    group/version/kind to count."""
    group, version = _split_api_version(api_version)
    if not (kind.isalnum() and version.isalnum() and _API_GROUP.match(group)):
        return None  # not a name kubernetes-validate can have a file for
    stem = kind.lower() + (f"-{group.split('.')[0]}" if group else "") + f"-{version}"
    schema_file = schema_dir / f"{stem}.json"
    if not schema_file.is_file():
        return None
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    if {"group": group, "version": version, "kind": kind} not in schema.get("x-kubernetes-group-version-kind", []):
        return None
    return jsonschema.Draft202012Validator(schema, registry=_core_registry(schema_dir))


@functools.cache
def _builtin_api_groups() -> frozenset[str]:
    """Every API group Kubernetes serves itself, read from the newest OpenAPI definitions.

    CRD groups never appear here, even those under k8s.io (gateway.networking.k8s.io,
    inference.networking.k8s.io, *.x-k8s.io): Kubernetes does not serve them."""
    newest = _strict_schema_dirs()[max(_strict_schema_dirs())]
    return frozenset(
        gvk["group"]
        for definition in _core_definitions(newest)["$defs"].values()
        for gvk in definition.get("x-kubernetes-group-version-kind", [])
    )


def is_core_api(api_version: str) -> bool:
    """True for API groups built into Kubernetes ("v1", "apps/v1", "resource.k8s.io/v1", ...);
    False for groups served by CRDs, including gateway.networking.k8s.io and kueue.x-k8s.io."""
    group, _ = _split_api_version(api_version)
    return group in _builtin_api_groups()


# --------------------------------------------------------------------------------------------
# CRD structural schemas -> JSON Schema
# --------------------------------------------------------------------------------------------

# Keywords JSON Schema shares with OpenAPI v3, copied as they are (boolean exclusive bounds are
# converted in `_translate`).
_VALUE_KEYWORDS = (
    "type",
    "enum",
    "required",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
)
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_STRING = {"type": "string"}
_OBJECT_META: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": _STRING,
        "generateName": _STRING,
        "namespace": _STRING,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "finalizers": {"type": "array", "items": _STRING},
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["apiVersion", "kind", "name", "uid"],
                "properties": {
                    "apiVersion": _STRING,
                    "kind": _STRING,
                    "name": _STRING,
                    "uid": _STRING,
                    "controller": {"type": "boolean"},
                    "blockOwnerDeletion": {"type": "boolean"},
                },
                "additionalProperties": False,
            },
        },
        "uid": _STRING,
        "resourceVersion": _STRING,
        "generation": {"type": "integer"},
        "selfLink": _STRING,
        # Rendered manifests often carry `creationTimestamp: null`.
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "managedFields": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
}
"""ObjectMeta as the API server accepts it. CRD schemas leave `metadata` open (`type: object`)
because the server validates it itself, so this stands in for that server-side check."""


@functools.cache
def _python_pattern(pattern: str) -> str | None:
    """The pattern in Python `re` syntax, or None if it cannot be expressed.

    CRD patterns are Go RE2. Kueue and prometheus-operator write `^(?i)...`, which Python only
    accepts at the very start; `X(?i)Y` becomes the equivalent scoped `X(?i:Y)`. Unicode classes
    such as Cilium's `\\PC` have no `re` equivalent and are not enforced."""
    candidates = [pattern]
    flag_at = pattern.find("(?i)")
    if flag_at > 0:
        candidates.append(f"{pattern[:flag_at]}(?i:{pattern[flag_at + 4:]})")
    for candidate in candidates:
        try:
            re.compile(candidate)
        except re.error:
            continue
        return candidate
    return None


def _is_int_or_string_branches(branches: list[Any]) -> bool:
    return all(isinstance(branch, Mapping) and branch.keys() == {"type"} for branch in branches) and {
        branch["type"] for branch in branches
    } <= {"integer", "string"}


def _metadata_schema(crd_metadata: Any) -> dict[str, Any]:
    """ObjectMeta, narrowed by whatever the CRD says (some restrict `name`)."""
    if isinstance(crd_metadata, Mapping) and crd_metadata.get("properties"):
        return {"allOf": [_OBJECT_META, _translate(crd_metadata, strict=False)]}
    return _OBJECT_META


def _translate(node: Mapping[str, Any], strict: bool) -> dict[str, Any]:
    """A Kubernetes structural schema node as JSON Schema (Draft 2020-12).

    * `x-kubernetes-int-or-string` accepts integers and strings;
    * `nullable` also accepts null;
    * OpenAPI's boolean `exclusiveMinimum/Maximum` become JSON Schema's numeric form;
    * unknown fields are errors, mirroring the API server, which prunes them: an object schema
      without `additionalProperties` or `x-kubernetes-preserve-unknown-fields` allows only its
      `properties` (none at all for a bare `type: object`, whose content the server drops);
    * `x-kubernetes-embedded-resource` objects also allow apiVersion, kind and ObjectMeta.

    `strict` is False inside allOf/anyOf/oneOf/not: in a structural schema those branches only
    add constraints to fields declared outside them, so they must not forbid anything extra.
    `x-kubernetes-validations` (CEL) rules are dropped, not evaluated.
    """
    out: dict[str, Any] = {key: node[key] for key in _VALUE_KEYWORDS if key in node}
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve_unknown = node.get("x-kubernetes-preserve-unknown-fields") is True
    if int_or_string:
        out["type"] = ["integer", "string"]
    if "pattern" in out:
        pattern = _python_pattern(out["pattern"])
        if pattern is None:
            del out["pattern"]
        else:
            out["pattern"] = pattern
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(exclusive), bool):
            if out.pop(exclusive) and bound in out:
                out[exclusive] = out.pop(bound)
    if node.get("nullable") is True:
        if "type" in out:
            out["type"] = [*(out["type"] if isinstance(out["type"], list) else [out["type"]]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]

    properties = {name: _translate(sub, strict) for name, sub in (node.get("properties") or {}).items()}
    if node.get("x-kubernetes-embedded-resource") is True:
        properties = {
            "apiVersion": _STRING,
            "kind": _STRING,
            **properties,
            "metadata": _metadata_schema((node.get("properties") or {}).get("metadata")),
        }
    if properties:
        out["properties"] = properties
    if isinstance(node.get("items"), Mapping):
        out["items"] = _translate(node["items"], strict)
    additional = node.get("additionalProperties")
    if isinstance(additional, Mapping):
        out["additionalProperties"] = _translate(additional, strict)
    elif isinstance(additional, bool):
        out["additionalProperties"] = additional
    elif strict and not preserve_unknown and (node.get("type") == "object" or properties):
        out["additionalProperties"] = False

    for junctor in ("allOf", "anyOf", "oneOf"):
        branches = node.get(junctor)
        if not branches or (int_or_string and _is_int_or_string_branches(branches)):
            continue  # the type list above already says "integer or string"
        out[junctor] = [_translate(branch, strict=False) for branch in branches]
    if isinstance(node.get("not"), Mapping):
        out["not"] = _translate(node["not"], strict=False)
    return out


def _crd_object_schema(openapi: Mapping[str, Any]) -> dict[str, Any]:
    """JSON Schema for a whole custom object: the CRD's schema plus apiVersion, kind and ObjectMeta."""
    schema = _translate(openapi, strict=True)
    schema.setdefault("type", "object")
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = _STRING
    properties["kind"] = _STRING
    properties["metadata"] = _metadata_schema((openapi.get("properties") or {}).get("metadata"))
    return schema


_OPENAPI_FILE_PATTERN = "*/openapi/swagger.json"
"""OpenAPI v2 specs of kinds whose CRDs an operator generates at run time (KubeVirt's VirtualMachine,
instance types): `<group>/<version>` and kind are read off the spec's create (POST) paths."""


def _inline(definitions: Mapping[str, Any], node: Any, seen: frozenset[str] = frozenset()) -> Any:
    """A swagger schema with its `$ref`s replaced by their definitions, as one structural schema; a
    recursive reference accepts anything (no KubeVirt field the library writes recurses)."""
    if isinstance(node, list):
        return [_inline(definitions, item, seen) for item in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/definitions/"):
        name = ref.removeprefix("#/definitions/")
        if name in seen:
            return {"x-kubernetes-preserve-unknown-fields": True}
        return _inline(definitions, definitions.get(name, {}), seen | {name})
    out = {key: _inline(definitions, value, seen) for key, value in node.items() if key != "default"}
    if out.get("format") == "int-or-string":
        out["x-kubernetes-int-or-string"] = True
    return out


def _openapi_kinds(spec: Mapping[str, Any]) -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> definition name, for every namespaced or cluster create path."""
    found = {}
    for path, operations in (spec.get("paths") or {}).items():
        parts = str(path).strip("/").split("/")
        if len(parts) < 4 or parts[0] != "apis" or not isinstance(operations, Mapping) or "post" not in operations:
            continue
        for parameter in operations["post"].get("parameters") or []:
            ref = (parameter.get("schema") or {}).get("$ref", "") if parameter.get("in") == "body" else ""
            if ref.startswith("#/definitions/"):
                name = ref.removeprefix("#/definitions/")
                found[(parts[1], parts[2], name.rsplit(".", 1)[-1])] = name
    return found


class _LazyValidator:
    """The validator of one OpenAPI definition, built on first use (inlining is not free)."""

    def __init__(self, definitions: Mapping[str, Any], name: str):
        self._definitions, self._name, self._validator = definitions, name, None

    def get(self) -> Validator:
        if self._validator is None:
            self._validator = jsonschema.Draft202012Validator(_crd_object_schema(_inline(self._definitions, {"$ref": f"#/definitions/{self._name}"})))
        return self._validator


_CRD_FILE_PATTERNS = ("*/crds/*", "*/chart*/crds/*", "*/charts/*/crds/*", "*/chart*/charts/*/crds/*")


# --------------------------------------------------------------------------------------------
# Helm charts
# --------------------------------------------------------------------------------------------


def _coalesce(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of user values over chart defaults: maps merge, a null deletes, the rest replaces."""
    merged = dict(defaults)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _coalesce(merged[key], value)
        else:
            merged[key] = value
    return merged


def _union_keys(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of both default trees. Unlike `_coalesce`, a null in `overlay` keeps the key: in a
    parent chart's values.yaml, `server:` under a subchart's section documents the key, unset."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _union_keys(merged[key], value)
        elif value is not None or key not in merged:
            merged[key] = value
    return merged


def _is_free_form(default: Any) -> bool:
    """A default of {} / [] / null documents no keys, so the chart accepts anything below it."""
    return default is None or default == {} or default == []


def _values_validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    """The JSON Schema draft named by `$schema`; draft-07 otherwise, as Helm's validator assumed."""
    dialect = str(schema.get("$schema", ""))
    for marker, validator in (
        ("2020-12", jsonschema.Draft202012Validator),
        ("2019-09", jsonschema.Draft201909Validator),
        ("draft-06", jsonschema.Draft6Validator),
        ("draft-04", jsonschema.Draft4Validator),
    ):
        if marker in dialect:
            return validator
    return jsonschema.Draft7Validator


class _DeclaredKeys:
    """Which keys a values.schema.json declares at a path, following local $refs and the
    allOf/anyOf/oneOf/then/else branches that apply to the same value."""

    def __init__(self, root: Mapping[str, Any]):
        self._root = root

    def expand(self, node: Any) -> list[Mapping[str, Any]]:
        expanded: list[Mapping[str, Any]] = []
        pending = [node]
        while pending:
            current = pending.pop()
            if not isinstance(current, Mapping) or any(current is seen for seen in expanded):
                continue
            expanded.append(current)
            if isinstance(current.get("$ref"), str):
                pending.append(self._resolve(current["$ref"]))
            for junctor in ("allOf", "anyOf", "oneOf"):
                pending.extend(current.get(junctor) or [])
            pending.extend(current[branch] for branch in ("then", "else") if branch in current)
        return expanded

    def child(self, nodes: list[Mapping[str, Any]], key: str) -> list[Mapping[str, Any]] | None:
        """The schemas for `key` below `nodes`, or None if the schema does not declare it.

        An `additionalProperties` schema declares every key (a typed map); `additionalProperties:
        true`, or its absence, declares none."""
        declared = False
        children: list[Any] = []
        for node in nodes:
            properties = node.get("properties") or {}
            if key in properties:
                declared = True
                children.append(properties[key])
            for pattern, sub in (node.get("patternProperties") or {}).items():
                if re.search(pattern, key):
                    declared = True
                    children.append(sub)
            if isinstance(node.get("additionalProperties"), Mapping):
                declared = True
                children.append(node["additionalProperties"])
            elif node.get("type") == "object" and not {"properties", "patternProperties", "additionalProperties"} & node.keys():
                # A free-form map (vCluster's `policies.resourceQuota.quota`, a securityContext):
                # the chart takes any key there, even where its default shows a few.
                declared = True
                children.append({})
        if not declared:
            return None
        return [expanded for child in children for expanded in self.expand(child)]

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None  # remote refs: nothing to learn about keys
        target: Any = self._root
        for token in filter(None, ref[1:].split("/")):
            token = token.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or token not in target:
                return None
            target = target[token]
        return target


@dataclass
class _Chart:
    """One chart folder: of the oracle directory, or of an unpacked chart package."""

    folder: str
    """How errors name it: relative to the oracle root ("gpu-operator/chart"), or the chart
    package ("kueue-0.19.2.tgz")."""
    defaults: dict[str, Any]
    schema: dict[str, Any] | None
    subcharts: dict[str, _Chart | None] = field(default_factory=dict)
    """By values key (alias or name); None when the dependency's files are not in the oracle."""
    subchart_defaults: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    """A subchart's defaults under this chart's (`_coalesce`), by values key, made once."""
    baselines: dict[tuple[int, FieldPath], tuple[Mapping[str, Any], set[tuple[FieldPath, str]]]] = field(default_factory=dict, repr=False, compare=False)
    """The schema's errors of defaults on their own, by (their identity, path): the same for every
    release of the chart, they were half of checking its values. Each holds its defaults, so an
    id is not reused while it is kept."""

    @functools.cached_property
    def validator(self) -> Validator | None:
        return _values_validator_class(self.schema)(self.schema) if self.schema is not None else None

    @functools.cached_property
    def declared_keys(self) -> _DeclaredKeys | None:
        return _DeclaredKeys(self.schema) if self.schema is not None else None


# --------------------------------------------------------------------------------------------
# The oracle directory
# --------------------------------------------------------------------------------------------


class Oracles:
    """Checks against one oracle directory, and against what the charts themselves ship (`add_crds`,
    `use_chart`), which wins over the oracle directory's copy. Files are read on first use and
    cached. `root` None: only what the charts ship is known."""

    def __init__(self, root: pathlib.Path | None):
        if root is not None:
            root = pathlib.Path(root)
            if not root.is_dir():
                raise OracleError(f"oracle directory {root} does not exist")
        self.root = root
        self._file_index: dict[tuple[str, str], list[tuple[pathlib.Path, str, bool]]] | None = None
        self._shipped: list[pathlib.Path] = []
        self._chart_folders: dict[str, tuple[pathlib.Path, str]] = {}
        self._crd_versions_by_kind: dict[tuple[str, str], list[tuple[pathlib.Path, str, bool]]] | None = None
        self._crd_documents: dict[pathlib.Path, list[dict[str, Any]]] = {}
        self._served_schemas: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        self._crd_validators: dict[tuple[str, str, str], list[Validator]] = {}
        self._charts: dict[str, _Chart] = {}
        self._chart_names: dict[pathlib.Path, str | None] = {}
        self._openapi: dict[tuple[str, str, str], Validator] | None = None

    # ---- what the charts ship ---------------------------------------------------------------

    def add_crds(self, source: str, crds: Iterable[Mapping[str, Any]]) -> None:
        """CRDs a chart ships (`source` names it): preferred over the oracle directory's for the
        kinds they define."""
        key = pathlib.Path(f"<{source}>")
        self._crd_documents[key] = [dict(c) for c in crds if c.get("kind") == "CustomResourceDefinition"]
        self._shipped.append(key)
        self._crd_versions_by_kind = None
        self._served_schemas.clear()
        self._crd_validators.clear()

    def use_chart(self, chart_dir: str, folder: pathlib.Path, label: str) -> None:
        """Read the values of the chart known as `chart_dir` (its oracle folder) from the unpacked
        chart in `folder`; errors name it `label`."""
        self._chart_folders[chart_dir] = (folder, label)
        self._charts.pop(chart_dir, None)

    def knows_values(self, chart_dir: str) -> bool:
        return chart_dir in self._chart_folders or (self.root is not None and (self.root / chart_dir / "values.yaml").is_file())

    def knows_kind(self, api_version: str, kind: str) -> bool:
        """Some CRD (shipped by a chart or in the oracle directory) defines group/kind, or an
        upstream OpenAPI spec does (`_OPENAPI_FILE_PATTERN`)."""
        group, version = _split_api_version(api_version)
        return bool(self._crd_index(group, kind)) or (group, version, kind) in self._openapi_validators()

    def _openapi_validators(self) -> dict[tuple[str, str, str], Validator]:
        if self._openapi is None:
            self._openapi = {}
            for path in sorted(self.root.glob(_OPENAPI_FILE_PATTERN)) if self.root is not None else ():
                spec = json.loads(path.read_text())
                definitions = spec.get("definitions") or {}
                for key, name in sorted(_openapi_kinds(spec).items()):
                    if key not in self._openapi:
                        self._openapi[key] = _LazyValidator(definitions, name)
        return self._openapi

    # ---- custom resources -------------------------------------------------------------------

    def crd_schema(self, api_version: str, kind: str) -> dict | None:
        """The openAPIV3Schema (as upstream wrote it) of the CRD serving group/version/kind, or None.

        When several oracle files define the same group/version/kind, this is the first by path."""
        group, version = _split_api_version(api_version)
        served = self._served(group, version, kind)
        return served[0] if served else None

    def validate_custom_object(self, obj: dict) -> list[str]:
        """Errors of a custom resource against its CRD (empty when valid): the one a chart ships
        (`add_crds`) when there is one, else the oracle directory's.

        When several oracle files define the same group/version/kind with different schemas (the
        network-operator bundles its own sriov CRDs), the object passes if it satisfies any of
        them; otherwise the errors against the first are reported. CEL rules
        (`x-kubernetes-validations`) are not evaluated."""
        identity = _object_identity(obj)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            return [f"{identity}: apiVersion and kind must be set"]
        group, version = _split_api_version(api_version)
        validators = self._custom_validators(group, version, kind)
        if not validators and (group, version, kind) in self._openapi_validators():
            validators = [self._openapi_validators()[(group, version, kind)].get()]
        if not validators:
            served_elsewhere = self._served_versions(group, kind)
            hint = f" (served versions: {', '.join(served_elsewhere)})" if served_elsewhere else ""
            return [f"{identity}: no upstream CRD for {api_version} {kind}{hint}"]
        errors_per_definition = []
        for validator in validators:
            errors = _error_lines(identity, _problems(validator.iter_errors(obj)))
            if not errors:
                return []
            errors_per_definition.append(errors)
        return errors_per_definition[0]

    def _custom_validators(self, group: str, version: str, kind: str) -> list[Validator]:
        key = (group, version, kind)
        if key not in self._crd_validators:
            self._crd_validators[key] = [
                jsonschema.Draft202012Validator(_crd_object_schema(openapi))
                for openapi in self._served(group, version, kind)
            ]
        return self._crd_validators[key]

    def _served(self, group: str, version: str, kind: str) -> list[dict[str, Any]]:
        """Every distinct openAPIV3Schema the oracle files serve for group/version/kind, in path order."""
        key = (group, version, kind)
        if key not in self._served_schemas:
            index = self._crd_index(group, kind)
            sources = list(dict.fromkeys(path for path, name, served in index if name == version and served))
            shipped = [source for source in sources if source in self._shipped]
            if shipped:  # a chart's own CRD is the one its cluster gets
                self._served_schemas[key] = self._schemas_in(shipped, group, version, kind)
            else:
                self._served_schemas[key] = _cached_schemas(sources, key, lambda: self._schemas_in(sources, group, version, kind))
        return self._served_schemas[key]

    def _schemas_in(self, sources: list[pathlib.Path], group: str, version: str, kind: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for source in sources:
            for crd in self._crds_in(source):
                spec = crd.get("spec") or {}
                if spec.get("group") != group or (spec.get("names") or {}).get("kind") != kind:
                    continue
                for crd_version in spec.get("versions") or []:
                    if crd_version.get("name") != version or crd_version.get("served") is not True:
                        continue
                    openapi = (crd_version.get("schema") or {}).get("openAPIV3Schema") or {}
                    if openapi not in found:
                        found.append(openapi)
        return found

    def _served_versions(self, group: str, kind: str) -> list[str]:
        return sorted({name for _, name, served in self._crd_index(group, kind) if served})

    def _crd_index(self, group: str, kind: str) -> list[tuple[pathlib.Path, str, bool]]:
        """(file, version, served) of every CRD version of group/kind: the charts' first (in the
        order they were added), then the oracle files' in path order.

        The oracle part is built once per process by parsing every CRD file (~1 s). Only the index
        is kept: all CRDs parsed take ~65 MB, so the few files a check needs are parsed again, and
        cached."""
        if self._file_index is None:
            self._file_index = _oracle_crd_index(self.root) if self.root else {}
        if self._crd_versions_by_kind is None:
            shipped = _index_crds((key, self._crd_documents[key]) for key in self._shipped)
            merged = {key: list(entries) for key, entries in shipped.items()}
            for key, entries in self._file_index.items():
                merged.setdefault(key, []).extend(entries)
            self._crd_versions_by_kind = merged
        return self._crd_versions_by_kind.get((group, kind), [])

    def _crds_in(self, path: pathlib.Path) -> list[dict[str, Any]]:
        if path not in self._crd_documents:
            self._crd_documents[path] = _read_crds(path)
        return self._crd_documents[path]

    # ---- built-in objects -------------------------------------------------------------------

    def validate_core_object(self, obj: dict, kubernetes_version: str) -> list[str]:
        """Errors of a built-in Kubernetes object against kubernetes-validate's strict schema for
        `kubernetes_version` ("1.34", "1.34.0"): unknown fields are errors. Raises ValueError for a
        version kubernetes-validate has no schemas for."""
        identity = _object_identity(obj)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            return [f"{identity}: apiVersion and kind must be set"]
        schema_dir = _strict_schema_dir(kubernetes_version)
        validator = _core_validator(schema_dir, api_version, kind)
        if validator is None:
            return [f"{identity}: Kubernetes {kubernetes_version} has no {api_version} {kind}"]
        return _error_lines(identity, _problems(validator.iter_errors(obj)))

    def validate_object(self, obj: dict, kubernetes_version: str) -> list[str]:
        """Built-in API groups go to `validate_core_object`, everything else to `validate_custom_object`."""
        api_version = obj.get("apiVersion")
        if isinstance(api_version, str) and is_core_api(api_version):
            return self.validate_core_object(obj, kubernetes_version)
        return self.validate_custom_object(obj)

    # ---- Helm values ------------------------------------------------------------------------

    def validate_values(self, chart_dir: str, values: dict) -> list[str]:
        """Errors of Helm values (the overrides a blueprint passes) for the chart in `chart_dir`
        (relative to the oracle root, e.g. "gpu-operator/chart" or "vcluster/chart-release").

        * values.schema.json, when present, validates the values merged over the defaults, as Helm
          does; errors the defaults already have on their own are not reported.
        * Key paths: every key set must exist in the default values.yaml (keys only present in
          comments do not count) or be declared by values.schema.json at that path. Below a
          default of {}, [] or null anything goes, and list items are never checked: a default
          list's items are examples, not a schema (a toleration example omits optional keys).
          A scalar default overridden by a map or list, or a map default overridden by a
          non-map, is an error. This catches misspelt keys even where the schema is lenient
          (Cilium's top level allows unknown keys).
        * A top-level key naming a dependency (its alias, else its name) is checked against the
          subchart's values.yaml (merged with the parent's defaults for it) and its schema;
          dependencies whose files are not in the oracle accept anything. `global` is checked
          against the defaults of the chart and its subcharts, which are usually free-form.
        """
        chart = self._chart(chart_dir)
        if not isinstance(values, Mapping):
            return [f"{chart.folder}: values: expected object, got {_json_type(values)}"]
        top: FieldPath = ("values",)
        schema_problems = self._schema_problems(chart, chart.defaults, values, top)
        key_problems: list[tuple[FieldPath, str]] = []
        own_keys = {key: value for key, value in values.items() if key not in chart.subcharts and key != "global"}
        key_problems.extend(
            self._key_problems(own_keys, chart.defaults, chart, self._root_nodes(chart), top, "the chart's values.yaml")
        )
        if "global" in values:
            key_problems.extend(
                self._key_problems(
                    {"global": values["global"]},
                    {"global": self._global_defaults(chart)},
                    chart,
                    self._root_nodes(chart),
                    top,
                    "the global defaults of the chart and its subcharts",
                )
            )
        for key, subchart in chart.subcharts.items():
            value = values.get(key)
            if subchart is None or value is None:
                continue  # not set, or the subchart's files are not in the oracle
            path = (*top, key)
            if not isinstance(value, Mapping):
                key_problems.append((path, f"expected a map of subchart values, got {_json_type(value)}"))
                continue
            parent_default = chart.defaults.get(key)
            parent_default = parent_default if isinstance(parent_default, Mapping) else {}
            known_keys = _union_keys(subchart.defaults, parent_default)
            where = f"the {key} subchart's values.yaml"
            sub_nodes = self._root_nodes(subchart)
            key_problems.extend(self._key_problems(value, known_keys, subchart, sub_nodes, path, where))
            if key not in chart.subchart_defaults:
                chart.subchart_defaults[key] = _coalesce(subchart.defaults, parent_default)
            schema_problems |= self._schema_problems(subchart, chart.subchart_defaults[key], value, path)
        # A misspelt key that a strict schema already reports as an unknown field needs no second line.
        unknown_to_schema = {path for path, message in schema_problems if message.startswith("unknown field")}
        key_problems = [
            (path, message)
            for path, message in key_problems
            if not (path in unknown_to_schema and message.startswith("not a key"))
        ]
        return _error_lines(chart.folder, [*schema_problems, *key_problems])

    @staticmethod
    def _root_nodes(chart: _Chart) -> list[Mapping[str, Any]]:
        return chart.declared_keys.expand(chart.schema) if chart.declared_keys else []

    def _key_problems(
        self,
        overrides: Mapping[str, Any],
        defaults: Mapping[str, Any],
        chart: _Chart,
        schema_nodes: list[Mapping[str, Any]],
        path: FieldPath,
        where: str,
    ) -> Iterator[tuple[FieldPath, str]]:
        for key, value in overrides.items():
            key_path = (*path, key)
            declared = chart.declared_keys.child(schema_nodes, key) if chart.declared_keys else None
            if key not in defaults:
                if declared is None:
                    yield key_path, f"not a key of {where}"
                continue  # declared only by the schema, which validates it
            default = defaults[key]
            if value is None or _is_free_form(default):
                continue
            if isinstance(default, Mapping):
                if isinstance(value, Mapping):
                    yield from self._key_problems(value, default, chart, declared or [], key_path, where)
                elif declared is None:
                    yield key_path, f"expected a map like the default in {where}, got {_json_type(value)}"
            elif isinstance(default, list):
                if not isinstance(value, list) and declared is None:
                    yield key_path, f"expected a list like the default in {where}, got {_json_type(value)}"
            elif isinstance(value, (Mapping, list)) and declared is None:
                yield key_path, f"{where} has a scalar default here ({default!r}), got {_json_type(value)}"

    @staticmethod
    def _schema_problems(
        chart: _Chart, defaults: Mapping[str, Any], overrides: Mapping[str, Any], path: FieldPath
    ) -> set[tuple[FieldPath, str]]:
        """values.schema.json errors of the overrides merged over the defaults, less those the
        defaults have on their own (upstream's problem, not ours)."""
        if chart.validator is None:
            return set()
        suffix = f" ({chart.folder}/values.schema.json)"
        try:
            known = chart.baselines.get((id(defaults), path))
            if known is None:
                known = chart.baselines[id(defaults), path] = (defaults, _problems(chart.validator.iter_errors(dict(defaults)), path))
            baseline = known[1]
            merged = _problems(chart.validator.iter_errors(_coalesce(defaults, overrides)), path)
        except referencing.exceptions.Unresolvable as error:
            raise OracleError(f"{chart.folder}/values.schema.json: unresolvable reference: {error}") from error
        return {(where, message + suffix) for where, message in merged - baseline}

    @staticmethod
    def _global_defaults(chart: _Chart) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for source in [*(sub for sub in chart.subcharts.values() if sub), chart]:
            default = source.defaults.get("global")
            if isinstance(default, Mapping):
                merged = _union_keys(merged, default)
        return merged

    def _chart(self, chart_dir: str) -> _Chart:
        """`chart_dir`: an oracle folder (relative to the root; a chart registered with
        `use_chart` is read from its unpacked package instead), or the absolute folder of a
        subchart inside such a package."""
        if chart_dir not in self._charts:
            if chart_dir in self._chart_folders:
                folder, label = self._chart_folders[chart_dir]
            elif pathlib.Path(chart_dir).is_absolute():
                folder, label = pathlib.Path(chart_dir), self._subchart_label(pathlib.Path(chart_dir))
            elif self.root is not None:
                folder, label = self.root / chart_dir, chart_dir
            else:
                raise OracleError(f"{chart_dir}: no oracle directory and no chart package to read its values from")
            values_file = folder / "values.yaml"
            if not values_file.is_file():
                raise OracleError(f"{label}: no values.yaml in {folder.parent}")
            defaults = _load_yaml_file(values_file) or {}
            if not isinstance(defaults, dict):
                raise OracleError(f"{label}/values.yaml: expected a map at the top level")
            schema_file = folder / "values.schema.json"
            schema = json.loads(schema_file.read_text(encoding="utf-8")) if schema_file.is_file() else None
            chart = _Chart(folder=label, defaults=defaults, schema=schema)
            # Registered before the subcharts load, so a dependency cycle cannot recurse forever.
            self._charts[chart_dir] = chart
            chart_yaml = folder / "Chart.yaml"
            metadata = (_load_yaml_file(chart_yaml) or {}) if chart_yaml.is_file() else {}
            for dependency in metadata.get("dependencies") or []:
                subchart_folder = self._find_subchart(folder, str(dependency.get("name")), dependency.get("version"))
                chart.subcharts[str(dependency.get("alias") or dependency.get("name"))] = (
                    self._chart(self._chart_key(subchart_folder)) if subchart_folder else None
                )
        return self._charts[chart_dir]

    def _chart_key(self, folder: pathlib.Path) -> str:
        if self.root is not None and folder.is_relative_to(self.root):
            return folder.relative_to(self.root).as_posix()
        return str(folder)

    def _subchart_label(self, folder: pathlib.Path) -> str:
        for parent, label in self._chart_folders.values():
            if folder.is_relative_to(parent):
                return f"{label}/{folder.relative_to(parent).as_posix()}"
        return str(folder)

    def _find_subchart(self, folder: pathlib.Path, name: str, version: Any) -> pathlib.Path | None:
        """The folder of a dependency, matched like Helm does: by the `name` in its Chart.yaml.

        Looks in the chart's own charts/ (gpu-operator's node-feature-discovery), then, in the
        oracle directory, in the product's charts/ folder, where the oracle keeps local
        dependencies under their repository folder names (llm-d's routerlib is the chart "router",
        remediation's nvsentinel-janitor is "janitor"). A matching version wins a tie."""
        places = [folder / "charts"]
        if self.root is not None and folder.is_relative_to(self.root):
            places.append(self.root / folder.relative_to(self.root).parts[0] / "charts")
        matches = [
            candidate
            for charts in places
            if charts.is_dir()
            for candidate in sorted(charts.iterdir())
            if candidate != folder and self._chart_name(candidate) == name
        ]
        for candidate in matches:
            if version is not None and (_load_yaml_file(candidate / "Chart.yaml") or {}).get("version") == version:
                return candidate
        return matches[0] if matches else None

    def _chart_name(self, folder: pathlib.Path) -> str | None:
        if folder not in self._chart_names:
            chart_yaml = folder / "Chart.yaml"
            metadata = _load_yaml_file(chart_yaml) if chart_yaml.is_file() else None
            self._chart_names[folder] = metadata.get("name") if isinstance(metadata, dict) else None
        return self._chart_names[folder]


CRD_INDEX_FORMAT = 1
"""Bumped when the on-disk CRD index changes shape, so an old cache is never read."""


@functools.cache
def _oracle_crd_index(root: pathlib.Path) -> dict[tuple[str, str], list[tuple[pathlib.Path, str, bool]]]:
    """The CRD index of an oracle directory, once per process, from the user's cache when the
    directory's CRD files are byte for byte those it was built from (parsing them all takes ~1.5 s,
    hashing them ~30 ms)."""
    from ai_factory.factory.rendering.charts import user_cache_dir

    return cached_crd_index(root, user_cache_dir() / "crd-index")


def _crd_files(root: pathlib.Path) -> list[pathlib.Path]:
    files = {path for pattern in _CRD_FILE_PATTERNS for path in root.glob(pattern)}
    return sorted(path for path in files if path.is_file() and path.suffix in (".yaml", ".yml", ".json"))


def crd_index_key(root: pathlib.Path, files: list[pathlib.Path]) -> str:
    """A digest of the CRD files' names and contents (not their times: a fresh checkout of the
    same oracles reuses the index)."""
    digest = hashlib.sha256(f"crd-index {CRD_INDEX_FORMAT}\0".encode())
    for path in files:
        content = path.read_bytes()
        digest.update(f"{path.relative_to(root)}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def cached_crd_index(root: pathlib.Path, cache_dir: pathlib.Path) -> dict[tuple[str, str], list[tuple[pathlib.Path, str, bool]]]:
    """The CRD index of `root`, read from `cache_dir` when it holds one for the same content, else
    built and stored there (an unwritable cache only costs the rebuild next time)."""
    files = _crd_files(root)
    cached = cache_dir / f"{crd_index_key(root, files)}.json"
    try:
        entries = json.loads(cached.read_text(encoding="utf-8"))
        return {(group, kind): [(root / path, version, served) for path, version, served in versions] for group, kind, versions in entries}
    except (OSError, ValueError, TypeError):
        pass
    index = _index_crds((path, _read_crds(path)) for path in files)
    entries = [[group, kind, [[str(path.relative_to(root)), version, served] for path, version, served in versions]] for (group, kind), versions in index.items()]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(entries), encoding="utf-8")
        partial.replace(cached)  # atomic: a concurrent check reads the whole index or none
    except OSError:
        pass
    return index


SERVED_SCHEMAS_FORMAT = 1
"""Bumped when the on-disk served schemas change shape, so an old cache is never read."""


def _cached_schemas(sources: list[pathlib.Path], gvk: tuple[str, str, str], read: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The schemas oracle files serve for one group/version/kind (`read()` parses them), from the
    user's cache when those files are byte for byte those they were read from: a check of one
    changed tenant needs a dozen kinds, and parsing their CRD files was most of its schema check."""
    from ai_factory.factory.rendering.charts import user_cache_dir

    digest = hashlib.sha256(json.dumps([f"served-schemas {SERVED_SCHEMAS_FORMAT}", *gvk]).encode())
    try:
        for path in sources:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    except OSError:
        return read()  # as the parse reports it
    cached = user_cache_dir() / "crd-schemas" / f"{digest.hexdigest()}.json"
    try:
        return json.loads(cached.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    found = read()
    try:
        text = json.dumps(found)
    except (TypeError, ValueError):
        return found  # a value JSON cannot hold (a YAML timestamp): parsed every time
    if json.loads(text) != found:
        return found  # JSON would change it (a number as a key)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        partial.replace(cached)  # atomic: a concurrent check reads all of it or none
    except OSError:
        pass
    return found


def _index_crds(sources: Iterable[tuple[pathlib.Path, list[dict[str, Any]]]]) -> dict[tuple[str, str], list[tuple[pathlib.Path, str, bool]]]:
    index: dict[tuple[str, str], list[tuple[pathlib.Path, str, bool]]] = defaultdict(list)
    for path, crds in sources:
        for crd in crds:
            spec = crd.get("spec") or {}
            crd_key = (str(spec.get("group")), str((spec.get("names") or {}).get("kind")))
            for crd_version in spec.get("versions") or []:
                index[crd_key].append((path, str(crd_version.get("name")), crd_version.get("served") is True))
    return dict(index)


_LEADING_COMMENTS = re.compile(r"\A(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*")


def _load_documents(text: str) -> list[Any]:
    # The re-serialized big CRDs are one line of JSON below a `# Source:` comment; json parses
    # them many times faster than YAML.
    body = text[_LEADING_COMMENTS.match(text).end() :]
    if body.startswith("{"):
        try:
            return [json.loads(body)]
        except ValueError:
            pass  # not a single JSON document (e.g. a YAML flow mapping): YAML reads it
    return [document for document in yaml.load_all(text, Loader=LOADER) if document is not None]


def _read_crds(path: pathlib.Path) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in one file: usually one, but a YAML stream may hold several."""
    try:
        documents = _load_documents(path.read_text(encoding="utf-8"))
    except (ValueError, yaml.YAMLError) as error:
        raise OracleError(f"{path}: cannot parse: {error}") from error
    return [
        document
        for document in documents
        if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition"
    ]


def _load_yaml_file(path: pathlib.Path) -> Any:
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=LOADER)
    except yaml.YAMLError as error:
        raise OracleError(f"{path}: cannot parse: {error}") from error
