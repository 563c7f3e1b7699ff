"""The label index the flavor, queue and namespace checks find their nodes and namespaces through:
always exactly what testing every item gives, in the items' order."""

import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from ai_factory.factory.checking.label_index import LabelIndex

ITEMS = {
    "a": {"pool": "h100", "domain": "x"},
    "b": {"pool": "h100", "domain": "y"},
    "c": {"pool": "a100", "domain": "x", "mig": "all-1g"},
    "d": {"pool": "h100", "domain": "x", "odd": ["list"]},
    "e": {},
}


def linear(wanted):
    return [name for name, labels in ITEMS.items() if all(labels.get(k) == v for k, v in wanted.items())]


@pytest.mark.parametrize(
    "wanted",
    [
        {},
        {"pool": "h100"},
        {"pool": "h100", "domain": "x"},
        {"domain": "x", "pool": "a100", "mig": "all-1g"},
        {"pool": "h100", "domain": "z"},
        {"absent": "v"},
        {"odd": ["list"]},
        {"odd": ["other"]},
        {"pool": "h100", "odd": ["list"]},
        {"pool": None},
        {"e": None},
    ],
)
def test_matching_is_every_item_whose_labels_hold_the_pairs_in_order(wanted):
    index = LabelIndex(ITEMS, ITEMS.__getitem__)
    assert index.matching(wanted) == linear(wanted)
    assert index.positions(wanted) == [list(ITEMS).index(name) for name in linear(wanted)]


def test_labels_are_read_once_per_item():
    reads = []
    index = LabelIndex(ITEMS, lambda name: reads.append(name) or ITEMS[name])
    index.matching({"pool": "h100"})
    index.matching({"domain": "x"})
    assert sorted(reads) == sorted(ITEMS)


def test_an_item_with_a_label_unknown_in_preview_is_tested_when_a_query_reaches_it():
    nodes = {"known": {"pool": "h100"}, "unknown": unknown_checking_proxy({"pool": "h100", "zone": UNKNOWN_STRING_VALUE})}
    index = LabelIndex(nodes, nodes.__getitem__)
    assert index.matching({"pool": "a100"}) == []
    with pytest.raises(UnknownValueError):
        index.matching({"pool": "h100", "zone": "z1"})
