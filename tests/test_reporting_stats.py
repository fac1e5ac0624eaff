"""The significance helpers of the paper-vs-ours tables (fedlib.reporting.stats)."""
import math

import pytest
import scipy.stats

from fedlib.reporting.stats import describe_p, reference_spread_p, welch_p


def test_welch_p_matches_the_test_on_raw_seeds_and_differs_from_students():
    ours, rival = [30.0, 32.0, 34.0, 31.0], [25.0, 29.0, 27.5]
    summary = lambda xs: (sum(xs) / len(xs), float(scipy.stats.tstd(xs)), len(xs))  # noqa: E731
    p, seeds = welch_p(summary(ours), summary(rival))
    assert p == pytest.approx(scipy.stats.ttest_ind(ours, rival, equal_var=False).pvalue, rel=1e-9)
    assert p != pytest.approx(scipy.stats.ttest_ind(ours, rival).pvalue, rel=1e-3)
    assert seeds == "4 vs 3"
    assert welch_p(summary(rival), summary(ours))[0] == pytest.approx(p, rel=1e-12)   # two-sided


@pytest.mark.parametrize("ours, rival, seeds", [
    ((1.0, 0.5, 1), (0.5, 0.2, 5), "1 vs 5"),           # one seed: no spread of its own
    ((1.0, 0.0, 3), (0.5, 0.0, 3), "3 vs 3"),           # no spread at all: undefined, not p = 0
    ((1.0, math.nan, 3), (0.5, 0.1, 3), "3 vs 3"),
    ((math.nan, math.nan, 0), (0.5, 0.1, 3), ""),       # a missing row
])
def test_welch_p_is_nan_when_undefined(ours, rival, seeds):
    p, named = welch_p(ours, rival)
    assert math.isnan(p) and named == seeds


def test_reference_spread_p_uses_the_borrowed_spread():
    p = reference_spread_p(29.35, 1, 26.77, 5, 0.80, 5)
    t = (29.35 - 26.77) / (0.80 * math.sqrt(1 + 1 / 5))
    assert p == pytest.approx(2 * scipy.stats.t.sf(t, 4), rel=1e-12)
    assert reference_spread_p(1.0, 1, 1.0, 1, 0.3, 5) == pytest.approx(1.0)
    assert math.isnan(reference_spread_p(1.0, 1, 0.5, 1, 0.3, 1))        # spread from a single seed
    assert math.isnan(reference_spread_p(1.0, 1, 0.5, 1, 0.0, 5))
    assert math.isnan(reference_spread_p(math.nan, 1, 0.5, 1, 0.3, 5))


def test_describe_p_words():
    assert describe_p(0.003, "5 vs 5") == "beyond seed noise (p = 0.003, 5 vs 5 seeds)"
    assert describe_p(0.2) == "within seed noise (p = 0.2)"
    assert describe_p(math.nan, "1 vs 5").startswith("untested")
