"""Ranking metrics: full ranking over all items and sampled-candidate ranking.

See :mod:`fedlib.metrics.ranking` for the formulas, tie rules and the CSR convention.
"""
from fedlib.metrics.ranking import (
    FULL_RANKING_METRICS,
    DivergedModelError,
    candidate_set_metrics,
    PairedTTestResult,
    csr_to_dense_mask,
    full_ranking_metrics,
    full_ranking_metrics_from_score_fn,
    mean_over_users,
    paired_ttest,
    rank_of_positive,
    sampled_metrics,
    select_csr_rows,
)

__all__ = [
    "FULL_RANKING_METRICS",
    "DivergedModelError",
    "candidate_set_metrics",
    "PairedTTestResult",
    "csr_to_dense_mask",
    "full_ranking_metrics",
    "full_ranking_metrics_from_score_fn",
    "mean_over_users",
    "paired_ttest",
    "rank_of_positive",
    "sampled_metrics",
    "select_csr_rows",
]
