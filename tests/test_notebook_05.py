"""Lesson 05 (FedCSR): the smoke execution's records satisfy the method's invariants, the committed
quick run learns (at least 3x the random-ranking MRR), and each exercise's parameter change
changes the result of the function the exercise calls (at smoke size)."""
import dataclasses

import numpy as np
import pytest
import torch

from fedlib.notebook.records import read_records, record_frame as frame
from fedlib.paths import project_root

STEM = "05_fedcsr"


def test_smoke_run_finished(records):
    # wall time is reported by ./run test, never asserted (shared, noisy machines)
    assert records["profile"] == "smoke"
    assert records["__finished__"] is True


def test_equation_toys(records):
    # 0→3 twice (binary) and 0→4: row 0 of A* is [0, 0, 0, .5, .5]
    assert records["toy_graph_cross"][0] == pytest.approx([0, 0, 0, 0.5, 0.5])
    assert records["toy_propagation"]["code"] == pytest.approx(records["toy_propagation"]["by_hand"])
    assert records["mcl_toy"]["aligned"] < records["mcl_toy"]["domains swapped"]
    assert records["stop_gradient"]["target_grad"] == 0.0 and records["stop_gradient"]["predictor_grad"] > 0
    assert records["fedavg_toy"] == pytest.approx([0.75, 0.25])
    aug = records["augmentation"]
    assert aug["replaced"] == int(0.3 * (aug["length"] // 2)) and aug["replaced_cross_domain"]


def test_live_run_learns_on_the_synthetic_task(records):
    live = records["live_mrr"]
    # 1 + 20 candidates: random MRR ~0.17; the topic chains are learnable in three rounds
    assert live["random"] == pytest.approx(np.mean(1 / np.arange(1, 22)))
    assert live["FedCSR"] > 1.5 * live["random"] and live["w/o SCL & MCL"] > 1.5 * live["random"]


def test_audit_records(records):
    ties = frame(records["tie_audit"]).set_index("tie rule")
    candidates = int(ties["candidates"].iloc[0])
    mrr = ties.drop(columns="candidates")
    assert (mrr.loc["optimistic"] == 1.0).all() and (mrr.loc["code"] == 1.0).all()
    assert mrr.loc["pessimistic"].to_numpy() == pytest.approx(1.0 / candidates)
    assert 0 < records["dropped_share"] < 100
    assert records["deviations"]["count"] > 0


def test_headline_section_reads_the_recorded_rate_grid(records):
    """The headline section counts the recorded rate cells (part headline_lr) and gives a verdict
    row per domain and rival only when FedCSR's headline cells are recorded."""
    from fedlib.papers.fedcsr import experiment as experiments
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import config_hash, latest_records

    known = latest_records(read_runs("fedcsr", "paper"))
    rate_cells = experiments.grid_cells("headline_lr")
    assert records["headline"]["recorded_rates"] == sum(config_hash(c) in known for c in rate_cells)
    def recorded(method):  # the method's headline row has a run (seed 0 is the one a verdict can start from)
        return any(config_hash({**c, "seed": seed}) in known for c in experiments.grid_cells("headline")
                   if c["method"] == method for seed in (0, 1, 2))

    rivals = sum(recorded(m) for m in ("PiNet", "CLSR"))
    assert records["headline"]["verdicts"] == (2 * min(rivals, 2) if recorded("FedCSR") else 0)  # Food, Kitchen


def test_committed_quick_run_beats_random_by_three():
    """The lesson's promise: the live run at quick reaches at least 3x the random-ranking MRR."""
    committed = read_records(project_root() / "notebooks" / f"{STEM}.ipynb")
    assert committed["profile"] == "quick" and committed["__finished__"] is True
    live = committed["live_mrr"]
    assert live["random"] == pytest.approx(np.mean(1 / np.arange(1, 1001)))   # 1 + 999 candidates
    assert live["FedCSR"] >= 3 * live["random"], live
    assert live["rounds"] >= 6, "the convergence figure needs many points"


# ---------------------------------------------------------------- exercises, at smoke size
def _synthetic():
    from fedlib.papers.fedcsr import experiment as experiments
    return experiments.load_split("synthetic", 20, 0)


def test_exercise_1_alpha_changes_the_augmentation():
    from fedlib.papers.fedcsr.model import augment_sequence
    split = _synthetic()
    sequence = split.train.sequence(int(np.argmax(split.train.lengths())))
    half = sequence.size // 2
    replaced = {alpha: int((augment_sequence(sequence, split.num_items_a, split.num_items_b, alpha,
                                             np.random.default_rng(0))[:half] != sequence[:half]).sum())
                for alpha in (0.3, 0.7)}
    assert replaced[0.3] == int(0.3 * half) and replaced[0.7] == int(0.7 * half)
    assert replaced[0.7] > replaced[0.3]


def test_exercise_2_tau_changes_mcl():
    from fedlib.papers.fedcsr.model import mcl_loss
    generator = torch.Generator().manual_seed(0)
    z_global = [torch.randn(16, 8, generator=generator) for _ in range(2)]
    z_aligned = [z + 0.1 * torch.randn(16, 8, generator=generator) for z in z_global]
    at = {tau: float(mcl_loss(z_aligned, z_global, tau)) for tau in (0.5, 0.1)}
    assert at[0.1] < at[0.5]


def test_exercise_3_fewer_negatives_change_the_know_nothing_score():
    from fedlib.papers.fedcsr import experiment as experiments
    scores = {}
    for negatives in (20, 10):
        audit = experiments.constant_score_audit(experiments.load_split("synthetic", negatives, 0))
        scores[negatives] = audit.set_index("tie rule").loc["pessimistic"].drop("candidates").to_numpy(float)
        assert scores[negatives] == pytest.approx(1.0 / (negatives + 1))
    assert not np.allclose(scores[20], scores[10])
    assert experiments.random_ranking_mrr(100) == pytest.approx(0.0519, abs=1e-4)


def test_exercise_4_learning_rate_changes_the_run():
    from fedlib.papers.fedcsr import experiment as experiments
    curves = {}
    for lr in (0.02, 0.001):
        config = experiments.cell("synthetic", dim=8, rounds=2, patience=2, lr=lr, local_epochs=1, batch_size=32,
                                  platforms=3)
        curves[lr] = [row["valid/MRR"] for row in experiments.run_cell(config)["extra"]["curve"]]
    assert len(curves[0.02]) == 2 and curves[0.02] != curves[0.001]


# ---------------------------------------------------------------- the lesson's helpers
def test_largest_platforms_keeps_the_biggest_and_their_own_users():
    from fedlib.papers.fedcsr import experiment as experiments
    split = _synthetic()
    kept = experiments.largest_platforms(split, 3)
    sizes = sorted((len(rows) for rows in split.platforms), reverse=True)
    assert sorted(len(rows) for rows in kept.platforms) == sorted(sizes[:3])
    for role in ("valid", "test"):
        chosen = [split.extra[f"{role}_platforms"][k] for k in kept.extra["kept_platforms"]]
        assert all(np.array_equal(a, b) for a, b in zip(kept.extra[f"{role}_platforms"], chosen))
    with pytest.raises(ValueError):
        experiments.largest_platforms(split, 0)
    assert "platforms" not in experiments.cell("synthetic"), "default cells keep their keys (cache hashes)"
    with pytest.raises(ValueError):
        experiments.cell("synthetic", platforms=0)


def test_series_styles_stay_distinct_beyond_ten_lines():
    from fedlib.papers.fedcsr.figures import series_style
    styles = [tuple(str(v) for v in series_style(i).values()) for i in range(12)]
    assert len(set(styles)) == 12
    assert series_style(0)["color"] == series_style(10)["color"]
    assert series_style(0)["linestyle"] != series_style(10)["linestyle"]


def test_with_flags_marks_substitute_and_one_seed():
    import pandas as pd
    from fedlib.papers.fedcsr.tables import with_flags
    table = pd.DataFrame({"value_ours": [1.0, None, 2.0], "n_seeds": [1, 0, 3],
                          "note": ["SUBSTITUTE split of X", "needs download", "full data"]})
    assert list(with_flags(table)["flags"]) == ["substitute;one_seed", "", ""]


def test_lesson_counts_the_recorded_grid():
    """The lesson's "46 runs" (front matter and §4) is the number of cells of the paper-profile grid."""
    from fedlib.papers.fedcsr import experiment as experiments
    from fedlib.experiments import grid
    text = " ".join((project_root() / "notebooks" / f"{STEM}.py").read_text().replace("#", " ").split())
    cells = grid.unique_cells(c for part in experiments.PARTS if part not in experiments.HEADLINE_PARTS
                              for c in experiments.grid_cells(part))
    assert text.count(f"{len(cells)} runs") == 2
    assert grid.pending_cells("fedcsr", "paper", cells) == []


def test_ties_never_lift_a_recorded_fedcsr_run():
    """The lesson's audit says both tie rules agree for every recorded FedCSR run (a few thousandths of a point)."""
    from fedlib.papers.fedcsr import experiment as experiments
    from fedlib.reporting import read_runs
    checked = 0
    for run in read_runs("fedcsr", "paper"):
        if run.config.get("method") != "FedCSR":
            continue
        for domain in run.extra.get("domains", []):
            against = run.metrics.get(f"{experiments.TIES_AGAINST_PREFIX}{domain}/test/MRR")
            if against is not None:
                assert 0 <= run.metrics[f"{domain}/test/MRR"] - against < 5e-5, (run.config, domain)
                checked += 1
    assert checked > 0


def test_committed_quick_audit_of_the_tie_rule():
    committed = read_records(project_root() / "notebooks" / f"{STEM}.ipynb")
    ties = frame(committed["tie_audit"]).set_index("tie rule").drop(columns="candidates")
    assert (ties.loc["code"] == 1.0).all() and ties.loc["pessimistic"].to_numpy() == pytest.approx(0.001)
