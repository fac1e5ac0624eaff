"""Is a gap between two table rows larger than the seed spread? Tests on summary statistics.

The paper-vs-ours tables keep, per row, the seed mean (``value_ours``), the sample standard
deviation over seeds (``std_ours``) and the number of seeds (``n_seeds``). A claim such as "A
beats B" compares two rows; these helpers say whether the gap could be seed noise:

* :func:`welch_p`: both rows have >= 2 seeds: the two-sided Welch t-test (unequal spreads);
* :func:`reference_spread_p`: a one-seed setting (a sweep point) against another, with the
  spread borrowed from a setting that has several seeds (both are assumed to share it);
* :func:`paired_p`: two readings of the same seeds (e.g. one run selected under two round caps),
  on their per-seed differences;
* :func:`seed_verdicts`: the paper's method against its strongest rivals in every setting.

Both return NaN when the test is undefined (too few seeds, no spread at all), never a
p-value of 0 or 1 that the data cannot support.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

__all__ = ["Summary", "welch_p", "reference_spread_p", "paired_p", "describe_p", "seed_verdicts"]

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


def paired_p(differences: Sequence[float]) -> float:
    """Two-sided p of the paired t-test that the per-seed ``differences`` (b − a, one per seed,
    both readings from the same seed) have mean zero; NaN with fewer than two finite differences
    or when they are all equal (no spread: the test is undefined, however large the mean)."""
    values = [float(d) for d in differences if math.isfinite(float(d))]
    if len(values) < 2 or max(values) == min(values):
        return math.nan
    from scipy.stats import ttest_1samp
    return float(ttest_1samp(values, 0.0).pvalue)


def describe_p(p: float, seeds: str = "", level: float = 0.05) -> str:
    """``"beyond seed noise (p = 0.003, 5 vs 5 seeds)"``, ``"within seed noise (...)"`` or
    ``"untested (fewer than two seeds a side)"`` when ``p`` is NaN."""
    if not math.isfinite(p):
        return "untested (fewer than two seeds a side)"
    where = "beyond" if p < level else "within"
    return f"{where} seed noise (p = {p:.2g}" + (f", {seeds} seeds)" if seeds else ")")


def seed_verdicts(rows: "pd.DataFrame", *, by: Sequence[str], label: str, ours: str, rivals: int = 2,
                  also: Sequence[str] = (), level: float = 0.05) -> "pd.DataFrame":
    """The paper's method against its strongest rivals in every setting, with a Welch test over seeds.

    The fair-budget rule of the lessons: a verdict about a headline setting compares the paper's
    method with the ``rivals`` strongest other methods of that setting (by seed mean), each
    across its seeds (:func:`welch_p`), and says "within seed noise" when the gap could be noise.

    Args:
        rows: one row per (setting, method) with ``value_ours`` (seed mean; higher is better),
            ``std_ours`` (sample std over seeds, NaN for one seed) and ``n_seeds``; rows without
            a value of ours are left out.
        by: the columns naming a setting (``["dataset", "backbone"]``).
        label: the column naming a method (``"method"``).
        ours: the paper's method as ``label`` names it.
        rivals: how many of the strongest other methods to compare with.
        also: methods compared in addition, before the strongest of the rest (a reference
            such as fine-tuning), where the setting has them.
        level: the test's significance level.

    Returns:
        One row per (setting, rival): ``by``, ``rival``, ``ours`` and ``theirs`` (seed means),
        ``gap %`` (ours over theirs − 1, in percent), ``seeds`` (``"3 vs 3"``), ``p`` (NaN when
        untested) and ``verdict``: ``"ahead"`` / ``"behind"`` (beyond seed noise),
        ``"within seed noise"`` or ``"untested (fewer than two seeds a side)"``. A setting
        without the paper's method gives no row.
    """
    import pandas as pd

    missing = [c for c in [*by, label, "value_ours", "std_ours", "n_seeds"] if c not in rows.columns]
    if missing:
        raise ValueError(f"seed_verdicts: rows lack column(s) {missing}; give a results table's rows "
                         "(value_ours, std_ours, n_seeds) with the setting and method columns")
    out = []
    valued = rows[pd.to_numeric(rows["value_ours"], errors="coerce").notna()]
    for setting, group in valued.groupby(list(by), sort=False):
        setting = setting if isinstance(setting, tuple) else (setting,)
        if (group[label] == ours).sum() > 1:
            raise ValueError(f"seed_verdicts: {dict(zip(by, setting))} has {int((group[label] == ours).sum())} rows "
                             f"of {ours!r}; filter the rows to one metric first")
        mine = group[group[label] == ours]
        if mine.empty:
            continue
        summary = lambda row: (float(row["value_ours"]), float(row["std_ours"]) if pd.notna(row["std_ours"]) else math.nan,
                               int(row["n_seeds"]))
        me = summary(mine.iloc[0])
        fixed = group[group[label].isin(list(also)) & (group[label] != ours)]
        rest = group[~group[label].isin([ours, *also])].sort_values("value_ours", ascending=False).head(int(rivals))
        for _, other in pd.concat([fixed, rest]).iterrows():
            them = summary(other)
            p, seeds = welch_p(me, them)
            verdict = ("untested (fewer than two seeds a side)" if not math.isfinite(p)
                       else "within seed noise" if p >= level else "ahead" if me[0] > them[0] else "behind")
            out.append({**dict(zip(by, setting)), "rival": other[label], "ours": me[0], "theirs": them[0],
                        "gap %": 100.0 * (me[0] / them[0] - 1.0) if them[0] else math.nan, "seeds": seeds, "p": p,
                        "verdict": verdict})
    return pd.DataFrame(out, columns=[*by, "rival", "ours", "theirs", "gap %", "seeds", "p", "verdict"])
