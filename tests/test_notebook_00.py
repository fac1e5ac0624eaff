"""Notebook 00 at the smoke profile: the recorded metrics satisfy the lesson's invariants."""
import pytest

from fedlib.notebook.records import record_frame as frame

STEM = "00_fedrec_from_scratch"


def test_smoke_run_finished(records):
    # wall time is reported by ./run test, never asserted (shared, noisy machines)
    assert records["profile"] == "smoke"
    assert records["__finished__"] is True


def test_fedavg_identity_and_executor_equivalence(records):
    assert records["fedavg_identity_max_abs_diff"] < 1e-5
    assert records["executor_max_abs_diff"] < 1e-4  # float32, a few rounds


def test_fedmf_learns(records):
    assert records["fedmf_last_loss"] < records["fedmf_first_loss"]
    metrics = frame(records["test_metrics"]).set_index("method")
    assert set(metrics.index) == {"Most popular", "Centralised MF", "FedMF", "Local-only"}
    values = metrics.drop(columns=[]).to_numpy(dtype=float)
    assert ((values >= 0) & (values <= 1)).all()
    # sampled 1+99 numbers are never below full-ranking ones at the same K
    assert (metrics["sampled HR@10"] >= metrics["Recall@10"]).all()


def test_inference_attack_behaves_as_the_gradient_structure_predicts(records):
    attack = frame(records["attack"])
    no_noise = attack[attack["noise scale λ"] == 0].set_index("attack")
    # changed rows = positives + 4 sampled negatives each: precision about 1/5, recall 1
    assert 0.15 <= no_noise.loc["changed rows", "precision"] <= 0.35
    assert no_noise.loc["changed rows", "recall"] == pytest.approx(1.0)
    # one local step: every row moves along ±p_u, so the sign split finds the positives
    assert no_noise.loc["sign", "precision"] > 0.9
    assert set(attack["attack"]) == {"changed rows", "sign", "changed rows, above noise", "sign, above noise"}
    loudest = attack[attack["noise scale λ"] == attack["noise scale λ"].max()].set_index("attack")
    # full-support noise changes every row: guessing "changed" = guessing everything, precision n+/I
    assert loudest.loc["changed rows", "precision"] == pytest.approx(records["attack_positive_share"], abs=1e-9)
    assert loudest.loc["changed rows", "recall"] == pytest.approx(1.0)
    assert loudest.loc["changed rows", "precision"] < no_noise.loc["changed rows", "precision"]


def test_communication_counts(records):
    comm = frame(records["bytes_per_client"]).set_index(["upload mode", "direction"])["bytes per client"]
    assert comm[("full", "upload")] == comm[("full", "download")]  # the full table goes both ways
    assert comm[("rows", "upload")] < comm[("full", "upload")]


def test_noise_and_leak_audit_recorded(records):
    utility = frame(records["noise_utility"])
    assert utility["noise scale λ"].iloc[0] == 0.0 and len(utility) >= 2
    audit = frame(records["leak_audit"])
    assert len(audit) == 2 and audit["Recall@20"].between(0, 1).all()
