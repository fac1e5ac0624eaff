"""The one validation-selection rule every paper's grid uses (fedlib.experiments.selection)."""
import math

import pytest

from fedlib.experiments.selection import best_on_validation, is_finite_score


def test_highest_score_wins_whatever_its_position():
    assert best_on_validation([(0.1, 0.2), (0.5, 0.4), (1.0, 0.3)]) == 0.5
    assert best_on_validation([(1.0, 0.9), (0.5, 0.4)]) == 1.0


@pytest.mark.parametrize("failed", [None, math.nan, math.inf, -math.inf])
def test_a_run_without_a_real_score_never_wins(failed):
    # a diverged run (NaN, inf) or one never evaluated (None) is not a candidate, even when it is
    # the only other option or would sort first
    assert best_on_validation([("diverged", failed), ("ok", 0.01)]) == "ok"
    assert best_on_validation([("ok", 0.01), ("diverged", failed)]) == "ok"


def test_nothing_to_choose_gives_none():
    assert best_on_validation([]) is None
    assert best_on_validation([(0.1, None), (0.2, math.nan)]) is None


def test_ties_keep_grid_order_unless_a_preference_is_given():
    options = [(1e-2, 0.3), (1e-3, 0.3), (1e-1, 0.2)]
    assert best_on_validation(options) == 1e-2
    assert best_on_validation(options, prefer=lambda rate: rate) == 1e-3
    # a preference for the code's rate first, then the smaller rate (FedRKG's rule)
    code = 1e-2
    assert best_on_validation([(1e-3, 0.3), (1e-2, 0.3)], prefer=lambda r: (r != code, r)) == 1e-2


def test_the_preference_only_breaks_ties():
    # a shorter budget is preferred on a tie, but never over a better score
    options = [({"rounds": 800, "lr": 1e-2}, 0.35), ({"rounds": 200, "lr": 1e-2}, 0.34)]
    assert best_on_validation(options, prefer=lambda c: (c["rounds"], c["lr"])) == {"rounds": 800, "lr": 1e-2}
    options[1] = ({"rounds": 200, "lr": 1e-2}, 0.35)
    assert best_on_validation(options, prefer=lambda c: (c["rounds"], c["lr"])) == {"rounds": 200, "lr": 1e-2}


def test_generator_input_and_integer_scores():
    assert best_on_validation((lr, s) for lr, s in [(1, 0), (2, 1)]) == 2
    assert is_finite_score(0) and not is_finite_score(None) and not is_finite_score(float("nan"))
