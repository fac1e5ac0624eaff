"""Notebook 05 (FedCSR) at the smoke profile: recorded metrics satisfy the method's invariants."""
import numpy as np
import pytest

from fedlib.notebook.records import record_frame as frame

STEM = "05_fedcsr"


def test_smoke_run_finished(records):
    # wall time is reported by ./run test, never asserted (shared, noisy machines)
    assert records["profile"] == "smoke"
    assert records["__finished__"] is True


def test_equation_toys(records):
    # 0→3 twice (binary) and 0→4: row 0 of A* is [0, 0, 0, .5, .5]
    assert records["toy_graph_cross"][0] == pytest.approx([0, 0, 0, 0.5, 0.5])
    assert records["causal_gap"]["before"] < 1e-6            # earlier positions ignore a later change
    assert records["causal_gap"]["last"] > 1e-3              # ... which the changed position does see
    assert records["first_b_item_loss"] < 1e-6               # global id NA is column 0 of the B head
    assert records["mcl_toy"]["aligned"] < records["mcl_toy"]["domains swapped"]
    assert records["stop_gradient"]["target_grad"] == 0.0 and records["stop_gradient"]["predictor_grad"] > 0
    assert records["fedavg_toy"] == pytest.approx([0.75, 0.25])
    aug = records["augmentation"]
    assert aug["replaced"] == int(0.3 * (aug["length"] // 2)) and aug["replaced_cross_domain"]


def test_communication_is_measured_from_the_model(records):
    comm = records["communication"]
    assert comm["model MB (one platform, one way)"] > 0
    assert 0 < comm["item tables and heads (% of the model)"] <= 100
    assert comm["per round, all platforms, up + down (MB)"] >= 2 * comm["model MB (one platform, one way)"]


def test_every_method_variant_and_audit_row_trains(records):
    runs = frame(records["main_runs"])
    labels = set(runs["method"])
    assert {"FedCSR", "TiSASRec", "CLSR", "CoNet", "CCDR", "PiNet", "PSJNet", "MIFN", "C2DSR", "Individual",
            "Centralized", "w/o SCL", "w/o MCL", "w/o SCL & MCL", "w/o unified", "w/o single",
            "code: all", "code: shared Adam", "code: central graph"} <= labels
    for domain in ("A", "B"):
        mrr, hr = runs[f"{domain} MRR"].to_numpy(float), runs[f"{domain} HR@10"].to_numpy(float)
        assert np.isfinite(mrr).all() and ((mrr > 0) & (mrr <= 1)).all() and ((hr >= 0) & (hr <= 1)).all()
    # the synthetic task has 20 negatives (random MRR ~0.17): FedCSR learns the topic chains
    fed = runs[(runs["method"] == "FedCSR")]
    assert (fed[["A MRR", "B MRR"]].to_numpy() > 0.3).all()
    assert (fed[["A MRR (full ranking)", "B MRR (full ranking)"]].to_numpy() < fed[["A MRR", "B MRR"]].to_numpy()).all()
    curve = records["demo_curve"]
    assert len(curve) >= 2 and curve[-1]["loss"] < curve[0]["loss"]
    assert records["case_study"]["candidates"] == 21 and 1 <= records["case_study"]["rank_of_truth"] <= 21


def test_test_selection_is_never_below_validation_selection(records):
    gap = records["selection_gap"]
    assert gap["min"] >= -1e-9 and gap["max"] >= gap["mean"] >= gap["min"]
    audit = frame(records["audit_runs"])
    assert {"FedCSR", "code: all"} <= set(audit["variant"])
