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


@pytest.mark.parametrize("strategy, fits", [("minibatch", "25"), ("tma", "10")])
def test_default_fanouts_that_do_not_fit_the_model_are_named_before_launch(strategy, fits):
    """`--layers 1` with minibatch or tma failed after launch, blaming options.fanouts the
    user never set; now refused when the config is built, saying they are the default and
    giving a list that fits."""
    from quietgnn.config import load_config
    with pytest.raises(ValueError) as ei:
        load_config(None, {"strategy": strategy, "model": {"layers": 1}})
    msg = str(ei.value)
    assert "(the default, made for 2 layers) has 2 entries but model.layers = 1" in msg, msg
    assert msg.endswith(f"e.g. --options.fanouts {fits}")
    cfg = load_config(None, {"strategy": strategy, "model": {"layers": 1},
                             "options": {"fanouts": fits}})
    assert cfg.model.layers == 1
    with pytest.raises(ValueError, match=r"options.fanouts = \[5, 5\] has 2 entries but "
                                         r"model.layers = 3; .* --options.fanouts"):
        load_config(None, {"strategy": strategy, "model": {"layers": 3},
                           "options": {"fanouts": "5,5"}})
