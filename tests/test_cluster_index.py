"""The pack's index of a stack (`kube.Cluster`): what it reads once for every policy of a run."""

import pytest
from pulumi_policy import PolicyResource

from ai_factory.policies.aif_policies.kube import Cluster


def resource(kind: str, name: str, namespace: str | None) -> PolicyResource:
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    return PolicyResource(f"kubernetes:core/v1:{kind}", {"metadata": metadata}, f"urn:{name}", name, None, None, None, [], {})


def test_objects_of_a_kind_in_a_namespace_are_those_in_stack_order():
    cluster = Cluster([resource("ConfigMap", "b", "x"), resource("Secret", "s", "x"), resource("ConfigMap", "a", "x"), resource("ConfigMap", "c", "y")])
    assert [o.name for o in cluster.in_namespace("ConfigMap", "x")] == ["b", "a"]
    assert cluster.in_namespace("ConfigMap", None) == [] and cluster.in_namespace("Pod", "x") == []


def test_what_a_policy_reads_once_is_replayed_to_every_reader_as_it_came():
    produced = []

    def produce():
        for item in range(3):
            produced.append(item)
            yield item

    cluster = Cluster([])
    first = iter(cluster.once("items", produce))
    assert next(first) == 0 and produced == [0]  # a reader that stops early reads no further
    assert list(cluster.once("items", produce)) == [0, 1, 2]
    assert list(first) == [1, 2] and produced == [0, 1, 2]


def test_an_error_reaches_every_reader_where_the_source_raised_it():
    def produce():
        yield "read"
        raise LookupError("unknown during preview")

    cluster = Cluster([])
    for _ in range(2):
        seen = []
        with pytest.raises(LookupError, match="unknown during preview"):
            for item in cluster.once("items", produce):
                seen.append(item)
        assert seen == ["read"]
