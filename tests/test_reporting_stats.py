"""The significance helpers of the paper-vs-ours tables (fedlib.reporting.stats)."""
import math

import numpy as np
import pytest
import scipy.stats

from fedlib.reporting.stats import describe_p, paired_p, reference_spread_p, welch_p


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


def test_paired_p_is_the_paired_t_test_and_nan_when_undefined():
    before, after = [9.30, 8.54, 7.17, 8.10], [7.82, 8.99, 7.17, 7.60]
    differences = [b - a for a, b in zip(before, after)]
    assert paired_p(differences) == pytest.approx(scipy.stats.ttest_rel(after, before).pvalue, rel=1e-9)
    assert paired_p(differences) != pytest.approx(scipy.stats.ttest_ind(after, before).pvalue, rel=1e-3)
    assert paired_p([0.5, -0.5, math.nan, 1.0]) == pytest.approx(scipy.stats.ttest_1samp([0.5, -0.5, 1.0], 0).pvalue)
    assert math.isnan(paired_p([0.4]))                  # one pair: no spread
    assert math.isnan(paired_p([0.4, 0.4, 0.4]))        # equal differences: undefined, not p = 0
    assert math.isnan(paired_p([]))


def test_describe_p_words():
    assert describe_p(0.003, "5 vs 5") == "beyond seed noise (p = 0.003, 5 vs 5 seeds)"
    assert describe_p(0.2) == "within seed noise (p = 0.2)"
    assert describe_p(math.nan, "1 vs 5").startswith("untested")


def test_seed_verdicts_compare_the_method_with_its_two_strongest_rivals():
    import pandas as pd
    from scipy.stats import ttest_ind

    from fedlib.reporting.stats import seed_verdicts

    seeds = {"F3CRec": [0.100, 0.102, 0.101], "KD": [0.090, 0.091, 0.089], "Reg": [0.101, 0.099, 0.103],
             "FT": [0.080, 0.081, 0.079], "SPP": [0.095]}
    rows = pd.DataFrame([{"dataset": "ML-100K", "method": m, "value_ours": float(np.mean(v)),
                          "std_ours": float(np.std(v, ddof=1)) if len(v) > 1 else np.nan, "n_seeds": len(v)}
                         for m, v in seeds.items()]
                        + [{"dataset": "Lastfm", "method": "F3CRec", "value_ours": 0.05, "std_ours": np.nan, "n_seeds": 1},
                           {"dataset": "Lastfm", "method": "FT", "value_ours": 0.04, "std_ours": np.nan, "n_seeds": 1},
                           {"dataset": "other", "method": "FT", "value_ours": 0.04, "std_ours": np.nan, "n_seeds": 1}])
    found = seed_verdicts(rows, by=["dataset"], label="method", ours="F3CRec")
    ml = found[found["dataset"] == "ML-100K"]
    # the two strongest others by mean: Reg (0.101) and SPP (0.095), not KD (0.090) or FT
    assert list(ml["rival"]) == ["Reg", "SPP"]
    reg = ml.iloc[0]
    assert reg["p"] == pytest.approx(ttest_ind(seeds["F3CRec"], seeds["Reg"], equal_var=False).pvalue)
    assert reg["verdict"] == "within seed noise" and reg["seeds"] == "3 vs 3"
    assert ml.iloc[1]["verdict"].startswith("untested")  # SPP has one seed
    ahead = seed_verdicts(rows[~rows["method"].isin(["Reg", "SPP"])], by=["dataset"], label="method", ours="F3CRec", rivals=1)
    assert ahead.iloc[0]["rival"] == "KD" and ahead.iloc[0]["verdict"] == "ahead"  # 0.101 vs 0.090, tight spreads
    behind = seed_verdicts(rows.replace({"F3CRec": "x", "FT": "F3CRec"}), by=["dataset"], label="method", ours="F3CRec",
                           rivals=1)
    assert behind.iloc[0]["verdict"] == "behind"
    assert "other" not in set(found["dataset"])  # a setting without the paper's method gives no row
    assert list(found[found["dataset"] == "Lastfm"]["gap %"]) == [pytest.approx(25.0)]
    # a reference method first, then the two strongest of the rest
    with_ft = seed_verdicts(rows, by=["dataset"], label="method", ours="F3CRec", also=["FT"])
    assert list(with_ft[with_ft["dataset"] == "ML-100K"]["rival"]) == ["FT", "Reg", "SPP"]
    assert with_ft.iloc[0]["verdict"] == "ahead"
    with pytest.raises(ValueError, match="lack column"):
        seed_verdicts(rows.drop(columns="std_ours"), by=["dataset"], label="method", ours="F3CRec")
    with pytest.raises(ValueError, match="filter the rows to one metric"):
        seed_verdicts(pd.concat([rows, rows]), by=["dataset"], label="method", ours="F3CRec")
