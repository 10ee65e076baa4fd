"""The one fanout parser (quietgnn/sampling/fanouts.py) and the strategies that use it."""

from __future__ import annotations

import pytest

from quietgnn.sampling.fanouts import parse_fanouts
from quietgnn.strategies import get_strategy


@pytest.mark.parametrize("value, want", [(10, [10]), ("15,10", [15, 10]), ("[25, 10]", [25, 10]),
                                         ("15 10 5", [15, 10, 5]), ((4, -1), [4, -1]),
                                         ([3], [3])])
def test_forms_of_the_command_line_and_of_yaml(value, want):
    assert parse_fanouts(value) == want


@pytest.mark.parametrize("value", [0, -2, "", "a,b", [1.5], [True], None, "3,0", {}])
def test_bad_values_name_the_value_and_the_form(value):
    with pytest.raises(ValueError, match=r"options\.fanouts = .*expected ints >= 1"):
        parse_fanouts(value)


def test_all_neighbours_only_where_allowed():
    assert parse_fanouts("-1,5") == [-1, 5]
    with pytest.raises(ValueError, match="expected ints >= 1, one per layer"):
        parse_fanouts("-1,5", allow_all=False)


@pytest.mark.parametrize("strategy, ok, bad", [("minibatch", "5,-1", "0,3"),
                                                ("grappa", "5,-1", "5,-3"),
                                                ("tma", "5,3", "5,-1")])
def test_every_sampling_strategy_parses_the_same_way(strategy, ok, bad):
    opts = get_strategy(strategy).Options
    assert opts(fanouts=ok).fanouts == parse_fanouts(ok)
    with pytest.raises(ValueError, match=r"options\.fanouts"):
        opts(fanouts=bad)
