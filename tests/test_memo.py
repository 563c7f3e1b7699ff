"""`factory.memo.by_identity`: results kept for the very arguments, a bounded number of them."""

from ai_factory.factory.memo import by_identity


def counting(kept: int):
    calls: list[tuple] = []

    @by_identity(kept=kept)
    def f(*args):
        calls.append(args)
        return len(calls)

    return f, calls


def test_a_result_is_kept_for_the_same_objects_and_computed_again_for_equal_ones():
    f, calls = counting(kept=2)
    a, b = tuple([1, 2]), tuple([1, 2])
    assert f(a) == f(a) == 1
    assert f(b) == 2  # equal but another object: a frozen object's identity is the key
    assert len(calls) == 2


def test_only_the_last_kept_results_are_held():
    f, calls = counting(kept=2)
    first, second, third = (1,), (2,), (3,)
    f(first), f(second), f(third)
    f(third), f(second)
    assert len(calls) == 3
    f(first)  # the oldest was let go
    assert len(calls) == 4
