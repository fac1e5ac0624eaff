"""Is a gap between two table rows larger than the seed spread? Tests on summary statistics.

The paper-vs-ours tables keep, per row, the seed mean (``value_ours``), the sample standard
deviation over seeds (``std_ours``) and the number of seeds (``n_seeds``). A claim such as "A
beats B" compares two rows; these helpers say whether the gap could be seed noise:

* :func:`welch_p`: both rows have >= 2 seeds: the two-sided Welch t-test (unequal spreads);
* :func:`reference_spread_p`: a one-seed setting (a sweep point) against another, with the
  spread borrowed from a setting that has several seeds (both are assumed to share it).

Both return NaN when the test is undefined (too few seeds, no spread at all), never a
p-value of 0 or 1 that the data cannot support.
"""
from __future__ import annotations

import math
from typing import Tuple

__all__ = ["Summary", "welch_p", "reference_spread_p", "describe_p"]

#: ``(seed mean, sample std, number of seeds)`` of one table row
Summary = Tuple[float, float, int]


def welch_p(ours: Summary, rival: Summary) -> Tuple[float, str]:
    """``(two-sided Welch p-value, "n vs m")`` of two ``(mean, std, n)``; NaN p with < 2 seeds a side.

    Zero spread on both sides leaves the test undefined (NaN), not "infinitely significant".
    The second element names the seed counts (``""`` when a side has no seed).
    """
    (m1, s1, n1), (m2, s2, n2) = ours, rival
    n1, n2 = int(n1), int(n2)
    seeds = f"{n1} vs {n2}" if n1 and n2 else ""
    if n1 < 2 or n2 < 2 or not all(math.isfinite(x) for x in (m1, s1, m2, s2)) or s1 + s2 == 0:
        return math.nan, seeds
    from scipy.stats import ttest_ind_from_stats
    return float(ttest_ind_from_stats(m1, s1, n1, m2, s2, n2, equal_var=False).pvalue), seeds


def reference_spread_p(a: float, n_a: int, b: float, n_b: int, std: float, n_std: int) -> float:
    """Two-sided p of ``a − b`` when both settings are assumed to share the seed spread ``std``
    measured on ``n_std`` seeds of a reference setting (t on ``n_std − 1`` degrees of freedom).

    A one-seed sweep point has no spread of its own, so the reference setting's seeds supply it:
    ``t = (a − b) / (std · sqrt(1/n_a + 1/n_b))``. NaN without a finite spread of >= 2 seeds.
    """
    if n_std < 2 or not math.isfinite(std) or std <= 0 or not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    from scipy.stats import t as student_t
    statistic = (a - b) / (std * math.sqrt(1.0 / n_a + 1.0 / n_b))
    return float(2.0 * student_t.sf(abs(statistic), n_std - 1))


def describe_p(p: float, seeds: str = "", level: float = 0.05) -> str:
    """``"beyond seed noise (p = 0.003, 5 vs 5 seeds)"``, ``"within seed noise (...)"`` or
    ``"untested (fewer than two seeds a side)"`` when ``p`` is NaN."""
    if not math.isfinite(p):
        return "untested (fewer than two seeds a side)"
    where = "beyond" if p < level else "within"
    return f"{where} seed noise (p = {p:.2g}" + (f", {seeds} seeds)" if seeds else ")")
