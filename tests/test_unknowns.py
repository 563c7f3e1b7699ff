"""The offline pack's proxy (factory/checking/unknowns.py) reads as CrossGuard's: every read gives
what `pulumi_policy.proxy.unknown_checking_proxy` gives, and raises where it raises, with its message."""

import pytest
from collections.abc import Mapping, Sequence
from pulumi_policy.proxy import UNKNOWN_NUMBER_VALUE, UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from ai_factory.factory.checking.unknowns import lazy_unknown_checking_proxy

INPUTS = {
    "metadata": {"name": "app", "namespace": UNKNOWN_STRING_VALUE, "labels": {"a": "1"}},
    "spec": {
        "replicas": UNKNOWN_NUMBER_VALUE,
        "containers": [{"name": "c", "image": "x:1"}, UNKNOWN_OBJECT_VALUE, {"env": [{"name": "E", "value": UNKNOWN_STRING_VALUE}]}],
        "empty": [],
    },
    "values": [[1, 2], "plain"],
}


def plain(value):
    """A read's result as data: proxies opened up (through the Mapping/Sequence protocols)."""
    if isinstance(value, Mapping):
        return ("map", {k: plain_or_error(lambda k=k: value[k]) for k in value})
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ("list", [plain_or_error(lambda i=i: value[i]) for i in range(len(value))])
    return value


def plain_or_error(read):
    try:
        return plain(read())
    except UnknownValueError as error:
        return ("unknown", error.message, error.unknown_type_sentinel)
    except (KeyError, IndexError, TypeError) as error:
        return ("error", type(error).__name__)


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda p: p, id="whole-tree-checks-every-value"),
        pytest.param(lambda p: p["metadata"]["name"], id="known-value-read"),
        pytest.param(lambda p: p["metadata"]["namespace"], id="unknown-value-skips-with-its-path"),
        pytest.param(lambda p: p["metadata"].get("namespace"), id="get-of-unknown-skips"),
        pytest.param(lambda p: p["metadata"].get("absent", "d"), id="get-of-absent-is-the-default"),
        pytest.param(lambda p: "namespace" in p["metadata"], id="membership-of-unknown-skips"),
        pytest.param(lambda p: "absent" in p["metadata"], id="membership-of-absent"),
        pytest.param(lambda p: list(p["metadata"].items()), id="items-reach-the-unknown"),
        pytest.param(lambda p: list(p["metadata"]), id="keys-are-not-checked"),
        pytest.param(lambda p: len(p["spec"]["containers"]), id="length-is-not-checked"),
        pytest.param(lambda p: len(p["metadata"]), id="length-of-a-map"),
        pytest.param(lambda p: p["spec"]["__target"], id="a-maps-target-holds-unchecked-values"),
        pytest.param(lambda p: p["values"]["__target"], id="a-lists-target"),
        pytest.param(lambda p: [c for c in p["spec"]["containers"]], id="iterating-a-list-stops-at-the-unknown"),
        pytest.param(lambda p: p["spec"]["containers"][1], id="unknown-element-skips"),
        pytest.param(lambda p: p["spec"]["containers"][-2], id="negative-index-names-its-own-path"),
        pytest.param(lambda p: p["spec"]["containers"][-1]["env"][0]["value"], id="nested-path-through-negative-index"),
        pytest.param(lambda p: p["spec"]["containers"][0:2], id="slice-holds-unchecked-values"),
        pytest.param(lambda p: p["spec"]["containers"][::-1][0]["env"][0]["value"], id="slice-elements-keep-their-paths"),
        pytest.param(lambda p: list(reversed(p["values"])), id="reversed"),
        pytest.param(lambda p: p["values"].index("plain"), id="index-of"),
        pytest.param(lambda p: "plain" in p["values"], id="membership-in-a-list"),
        pytest.param(lambda p: p["values"][5], id="index-out-of-range"),
        pytest.param(lambda p: p["absent"], id="absent-key"),
        pytest.param(lambda p: p["values"][0] == p["values"][0], id="a-list-equals-only-itself"),
        pytest.param(lambda p: p["metadata"]["labels"] == {"a": "1"}, id="a-map-equals-the-same-map"),
        pytest.param(lambda p: p["spec"]["empty"] is p["spec"]["empty"], id="a-nested-value-is-one-object"),
        pytest.param(lambda p: (isinstance(p, dict), isinstance(p["values"], list), isinstance(p, Mapping)), id="not-dict-or-list"),
    ],
)
def test_a_read_gives_what_crossguard_gives(read):
    assert plain_or_error(lambda: read(lazy_unknown_checking_proxy(INPUTS))) == plain_or_error(lambda: read(unknown_checking_proxy(INPUTS)))


def test_a_list_at_the_top_reads_as_crossguards():
    inputs = [{"a": UNKNOWN_STRING_VALUE}, 1]
    assert plain_or_error(lambda: lazy_unknown_checking_proxy(inputs)) == plain_or_error(lambda: unknown_checking_proxy(inputs))


def test_an_assignment_changes_the_proxy_never_the_inputs():
    inputs = {"metadata": {"labels": {"a": "1"}}}
    proxy, crossguard = lazy_unknown_checking_proxy(inputs), unknown_checking_proxy(inputs)
    for p in (proxy, crossguard):
        p["metadata"] = {"labels": {"b": UNKNOWN_STRING_VALUE}}
    assert inputs == {"metadata": {"labels": {"a": "1"}}}
    assert proxy["metadata"] == crossguard["metadata"] == {"labels": {"b": UNKNOWN_STRING_VALUE}}  # kept as assigned, unchecked
