import pytest

from ai_factory.factory.checking.tree import maps_within

POD = {"containers": [{"name": "c"}]}


@pytest.mark.parametrize(
    "value, skipped_key, expected",
    [
        ({"a": {"b": 1}}, None, [{"a": {"b": 1}}, {"b": 1}]),
        ({"spec": [POD, "text", [POD]]}, None, [{"spec": [POD, "text", [POD]]}, POD, POD["containers"][0], POD, POD["containers"][0]]),
        ({"metadata": {"labels": {"x": "y"}}, "spec": POD}, "metadata", [{"metadata": {"labels": {"x": "y"}}, "spec": POD}, POD, POD["containers"][0]]),
        ({"metadata": {"labels": {"x": "y"}}}, None, [{"metadata": {"labels": {"x": "y"}}}, {"labels": {"x": "y"}}, {"x": "y"}]),
        ("a string is no map", None, []),
        ([b"bytes", 3, None], None, []),
    ],
    ids=["nested", "lists-in-document-order", "skipped-key-not-entered", "every-key-entered", "string", "scalars"],
)
def test_maps_within_yields_every_map_outermost_first_in_document_order(value, skipped_key, expected):
    assert list(maps_within(value, skipped_key)) == expected
