"""The lesson-04 steps (fedlib.papers.fedpcl_cdr.lesson) on the synthetic smoke task."""
import re

import pandas as pd
import pytest

from fedlib.papers.fedpcl_cdr import experiment as X
from fedlib.papers.fedpcl_cdr import lesson


@pytest.fixture(scope="module")
def runs():
    return {variant: lesson.train_live(X.cell("synthetic", variant=variant, rounds=2), "smoke", record=False)
            for variant in ("FedPCL-CDR", "w/o LDP")}


def test_prototype_signal_separates_clipped_signal_from_noise(runs):
    noisy, clean = lesson.prototype_signal(runs["FedPCL-CDR"]), lesson.prototype_signal(runs["w/o LDP"])
    assert noisy["signal_norm"] <= 0.2 + 1e-6 and noisy["noise_norm"] > 0.8 and noisy["cosine"] < 0.5
    # without the Laplace noise what was sent is the clipped centroid itself (up to k-means' tolerance)
    assert clean["noise_norm"] < 0.02 and clean["cosine"] > 0.99


def test_resampled_signal_without_noise_is_the_clean_centroid(runs):
    out = lesson.resampled_signal(runs["FedPCL-CDR"], clip_norm=0.2, laplace_scale=0.0)
    assert out["noise_norm"] == pytest.approx(0.0, abs=1e-6) and out["cosine"] == pytest.approx(1.0, abs=1e-5)
    assert out["paper_epsilon"] == float("inf")


def test_server_view_counts_every_overlapping_user_once(runs):
    view = lesson.server_view(runs["FedPCL-CDR"])
    assert view["co_membership"].sum() == view["overlap_users"] > 0
    assert (view["co_membership"] > 0).sum() == view["distinct_profiles"]
    assert (view["co_membership"] == 1).sum() == view["singleton_profiles"]


def test_alignment_has_both_label_rows_and_chance_level_bounds(runs):
    table = lesson.prototype_alignment(runs["FedPCL-CDR"])
    assert list(table.index) == ["own cluster", "shuffled labels"]
    assert ((table["top-1"] >= 0) & (table["top-1"] <= 1)).all() and (table[["L_glob", "L_loc"]] > 0).all().all()


def test_live_table_and_curves(runs):
    table = lesson.live_table(runs)
    assert list(table.index) == ["FedPCL-CDR", "w/o LDP"]
    assert {"A HR@10", "B NDCG@10", "round", "seconds"} <= set(table.columns)
    curves = lesson.live_curves(runs)
    assert len(curves) == 4 and (curves[curves["round"] == 1]["L_glob"] == 0).all()  # no prototypes in round 1
    assert (curves[curves["round"] == 2]["L_glob"] > 0).all()


def test_train_live_rejects_a_baseline():
    with pytest.raises(ValueError, match="FedPCL-CDR"):
        lesson.train_live(X.cell("synthetic", "NeuMF", rounds=1), "smoke", record=False)


def test_deviation_summary_lists_every_deviating_cell():
    tables = {n: lesson.recorded_table(n) for n in (1, 2, 3, 4, 5)}
    summary = lesson.deviation_summary(tables, max_named=None)
    tidy = pd.concat(tables.values())
    tidy = tidy[tidy["value_ours"].notna() & tidy["value_paper"].notna()]
    far = ((tidy["value_ours"] - tidy["value_paper"]) / tidy["value_paper"]).abs() > 0.2
    assert summary["cells"].sum() == far.sum() > 0
    # each cell appears once as "<metric> ours (paper)": as many bracketed paper values as deviating cells
    named = sum(len(re.findall(r" \([-\d.,e+]+\)", text)) for text in summary["ours (paper)"])
    assert named == far.sum()
    # the lesson's shorter form names six rows per reason and counts the rest; the counts are the same
    short = lesson.deviation_summary(tables)
    assert list(short["cells"]) == list(summary["cells"])
    for full, shown in zip(summary["ours (paper)"], short["ours (paper)"]):
        rows = full.split("; ")
        assert shown == "; ".join(rows if len(rows) <= 6 else [*rows[:6], f"… and {len(rows) - 6} more"])


def test_deviation_rules_raise_on_a_cell_without_reason(monkeypatch):
    monkeypatch.setattr(lesson, "DEVIATION_REASONS", [({"table": "table1"}, "only table 1")])
    with pytest.raises(ValueError, match="without a reason"):
        lesson.deviation_summary({2: lesson.recorded_table(2)})
