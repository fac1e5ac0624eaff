"""Notebook 00 at the smoke profile: the recorded metrics satisfy the lesson's invariants; the
from-scratch FedMF loop written in the notebook equals ``run_federated``; the prose about the
quick run agrees with the committed quick records."""
import re

import numpy as np
import pytest
import torch

from fedlib.notebook.records import read_records
from fedlib.notebook.records import record_frame as frame
from fedlib.paths import project_root

STEM = "00_fedrec_from_scratch"
NOTEBOOK = project_root() / "notebooks" / f"{STEM}.py"


def test_smoke_run_finished(records):
    # wall time is reported by ./run test, never asserted (shared, noisy machines)
    assert records["profile"] == "smoke"
    assert records["__finished__"] is True


def test_fedavg_identity_and_executor_equivalence(records):
    assert records["fedavg_identity_max_abs_diff"] < 1e-5
    assert records["executor_max_abs_diff"] < 1e-4  # float32, a few rounds


def test_from_scratch_loop_equals_run_federated_in_the_notebook(records):
    diff = records["scratch_vs_library"]
    assert diff["item table"] < 1e-10 and diff["user vectors"] < 1e-10  # float64: rounding only
    assert diff["metrics max abs diff"] < 1e-9
    # the comparison is not vacuous: training moved the table by many orders of magnitude more
    assert diff["item table moved by"] > 1e6 * max(diff["item table"], 1e-300)


def _notebook_function(name: str):
    """The function ``name`` as defined in a code cell of the lesson's .py (executed here)."""
    cells = NOTEBOOK.read_text().split("# %%")
    [cell] = [c for c in cells if re.search(rf"^def {name}\(", c, re.M)]
    from fedlib.data.sampling import NegativeSampler
    from fedlib.engine import make_round_plan, round_generator
    namespace = {"torch": torch, "NegativeSampler": NegativeSampler, "make_round_plan": make_round_plan,
                 "round_generator": round_generator}
    exec(compile(cell, str(NOTEBOOK), "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("batch_size", [512, 16])  # one local step per client, or several
def test_notebook_from_scratch_function_equals_run_federated(batch_size):
    from fedlib.data.synthetic import drifting_stream
    from fedlib.engine import FederatedConfig, ParameterAveraging, fedmf_method, run_federated
    from fedlib.models import FedMF

    split = drifting_stream(num_users=30, num_items=60, interactions_per_user=40, drift=0.0, seed=0)[0]
    method = fedmf_method(FedMF(split.num_users, split.num_items, dim=8), lr=0.5)
    config = FederatedConfig(rounds=3, seed=4, num_negatives=4, batch_size=batch_size, test_at_end=False, dtype="float64")
    start = ParameterAveraging(method, None, config, device="cpu").init(config.seed)
    from_scratch = _notebook_function("fedmf_from_scratch")
    options = dict(lr=0.5, num_negatives=4, batch_size=batch_size)
    items, users = from_scratch(split.train, start.global_state["item_emb"], start.private_state["user_emb"], 3,
                                seed=4, **options)
    library = run_federated(method, split.train, config, device="cpu").state
    assert torch.allclose(items, library.global_state["item_emb"], rtol=0, atol=1e-12)
    assert torch.allclose(users, library.private_state["user_emb"], rtol=0, atol=1e-12)
    moved = float((items - start.global_state["item_emb"]).abs().max())
    assert moved > 1e-4
    # the same loop with another seed draws other negatives: the comparison can fail
    other, _ = from_scratch(split.train, start.global_state["item_emb"], start.private_state["user_emb"], 3,
                            seed=5, **options)
    assert float((other - library.global_state["item_emb"]).abs().max()) > 1e-6


def test_fedmf_learns(records):
    assert records["fedmf_last_loss"] < records["fedmf_first_loss"]
    metrics = frame(records["test_metrics"]).set_index("method")
    assert set(metrics.index) == {"Most popular", "Centralised MF", "FedMF", "Local-only"}
    values = metrics.to_numpy(dtype=float)
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


def test_noise_utility_and_leak_audit_recorded(records):
    utility = frame(records["noise_utility"])
    assert utility["noise scale λ"].iloc[0] == 0.0 and len(utility) >= 2
    audit = frame(records["leak_audit"]).set_index("sampler")
    assert len(audit) == 2 and audit["Recall@20"].between(0, 1).all()
    # the leak lifts the personal-table model: the audit's point
    assert audit["Recall@20"].iloc[1] > audit["Recall@20"].iloc[0]


# --- The prose describes the committed quick run: check it against that run's records. ---

@pytest.fixture(scope="module")
def quick():
    path = project_root() / "notebooks" / f"{STEM}.ipynb"
    values = read_records(path)
    if values.get("profile") != "quick":
        pytest.skip("the committed notebook is not a quick run")
    return values


def _paragraph(heading: str) -> str:
    found = [c for c in NOTEBOOK.read_text().split("# %%") if heading in c]
    assert len(found) == 1, heading
    return re.sub(r"\n#\s?", " ", found[0])


def test_reading_the_results_paragraph_matches_the_quick_run(quick):
    prose = _paragraph("**Reading the results**")
    metrics = frame(quick["test_metrics"]).set_index("method")
    fedmf, central = metrics.loc["FedMF", "NDCG@20"], metrics.loc["Centralised MF", "NDCG@20"]
    popular, local = metrics.loc["Most popular", "NDCG@20"], metrics.loc["Local-only", "NDCG@20"]
    assert "FedMF is on par with centralised MF" in prose
    assert abs(fedmf - central) <= 0.2 * central  # "on par": within 20 %
    assert "here slightly above it" in prose and fedmf >= central
    assert "Both are well above popularity" in prose
    assert min(fedmf, central) > 1.2 * popular
    assert "Local-only ranks near chance level" in prose
    # chance: 1 target among ~1,600 unranked items -> Recall@20 about 20/1,600; sampled HR@10 about 10/100
    assert metrics.loc["Local-only", "Recall@20"] < 0.05 and local < popular / 3
    assert abs(metrics.loc["Local-only", "sampled HR@10"] - 0.10) < 0.05
    assert "several times larger" in prose
    assert (metrics["sampled HR@10"] > 2 * metrics["Recall@10"]).all()


def test_attack_paragraph_matches_the_quick_run(quick):
    prose = _paragraph("Without noise the sign attack finds the positives almost exactly")
    attack = frame(quick["attack"])
    precision = attack.pivot(index="noise scale λ", columns="attack", values="precision")
    assert precision.loc[0.0, "sign"] > 0.95 and precision.loc[0.0, "sign"] > 3 * precision.loc[0.0, "changed rows"]
    largest = precision.index.max()
    assert "degrades to guessing every item" in prose
    assert precision.loc[largest, "changed rows"] == pytest.approx(quick["attack_positive_share"], abs=1e-9)
    assert "recovers part of the signal at small" in prose
    small = sorted(precision.index)[1]
    assert precision.loc[small, "changed rows, above noise"] > 2 * precision.loc[small, "changed rows"]
    assert "at large $\\lambda$ both attacks lose most of it" in prose
    assert precision.loc[largest, "sign, above noise"] < 0.5 * precision.loc[0.0, "sign"] or \
        np.isnan(precision.loc[largest, "sign, above noise"])
    utility = frame(quick["noise_utility"]).set_index("noise scale λ")["NDCG@20"]
    popular = frame(quick["test_metrics"]).set_index("method").loc["Most popular", "NDCG@20"]
    assert "noise up to $\\lambda = 1$ costs no measurable NDCG@20" in prose
    assert abs(utility.loc[1.0] - utility.loc[0.0]) < 0.05 * utility.loc[0.0]
    assert "$\\lambda = 3$ costs a clear share and falls below popularity" in prose
    assert utility.loc[3.0] < 0.9 * utility.loc[0.0] and utility.loc[3.0] < popular


def test_audit_paragraph_matches_the_quick_run(quick):
    prose = _paragraph("**What happened.**")
    audit = frame(quick["leak_audit"]).set_index("sampler")["Recall@20"]
    assert "local-only training is near chance" in prose and audit.iloc[0] < 0.05
    assert "ranks them at the top" in prose and audit.iloc[1] > 0.5
