"""FedKDRec grid: cells, the two-protocol recorder, every method's runner, lr selection."""
import math

import numpy as np
import pytest
import torch

from fedlib.papers.fedkdrec import experiment as X
from fedlib.reporting import read_runs
from fedlib.reporting.results import config_hash


# ---------------------------------------------------------------------------- cells
def test_cell_defaults_and_labels():
    c = X.cell("ML-100K", "FedKDRec", backbone="NeuMF")
    assert c["rounds"] == 200 and c["variant"] == "FedKDRec" and c["alpha"] == 0.5 and c["beta_range"] == [0.3, 0.7]
    assert c["lr"] == X.SELECTED["FedKDRec"] and c["weight_decay"] == X.WEIGHT_DECAY
    ptf = X.cell("ML-100K", "PTF-FedRec", backbone="NeuMF")
    assert ptf["method"] == "FedKDRec" and ptf["variant"] == "-m-c~s" and X.method_label(ptf) == "PTF-FedRec"
    assert ptf["lr"] == X.SELECTED["PTF-FedRec"]
    central = X.cell("ML-100K", "Centralized", backbone="LightGCN", rounds=30, central_epochs=7)
    assert central["rounds"] == 7 and "alpha" not in central
    assert X.cell("ML-100K", "FedMF", rounds=30, central_epochs=7)["rounds"] == 30
    # the same cell built twice hashes the same; a different seed does not
    assert config_hash(X.cell("ML-100K", "FedMF")) == config_hash(X.cell("ML-100K", "FedMF"))
    assert config_hash(X.cell("ML-100K", "FedMF", seed=1)) != config_hash(X.cell("ML-100K", "FedMF"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(dataset="ML-10M", method="FedMF"), "unknown dataset"),
    (dict(dataset="ML-100K", method="FedAvg"), "unknown method"),
    (dict(dataset="ML-100K", method="FedKDRec"), "needs backbone"),
    (dict(dataset="ML-100K", method="FedMF", backbone="NeuMF"), "has its own model"),
    (dict(dataset="ML-100K", method="FedKDRec", backbone="NeuMF", variant="-x"), "unknown FedKDRec variant"),
    (dict(dataset="ML-100K", method="FedMF", init="bert"), "init must be"),
    (dict(dataset="ML-100K", method="FedMF", eval_every=0), "eval_every"),
])
def test_bad_cells_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        X.cell(**kwargs)


def test_grid_parts_cover_the_paper():
    table1 = X.grid_cells("table1")
    labels = {(X.method_label(c), c["backbone"]) for c in table1}
    for b in X.BACKBONES:
        assert {("Centralized", b), ("PTF-FedRec", b), ("FedKDRec", b)} <= labels
    assert {("FedMF", None), ("FedNCF", None), ("FedPerGNN", None)} <= labels
    assert len(X.grid_cells("ablation")) == 6 * 3 and len(X.grid_cells("agent")) == 7
    assert len(X.grid_cells("sensitivity")) == 3 * (len(X.ALPHAS) + len(X.BETA_RANGES))
    # shared cells (Table 1's FedKDRec is Table 2's full row and the sweeps' centre) run once
    everything = [c for part in X.PARTS for c in X.grid_cells(part)]
    unique = X.unique_cells(everything)
    assert len(unique) < len(everything)
    assert len({config_hash(c) for c in unique}) == len(unique)
    with pytest.raises(ValueError, match="unknown part"):
        X.grid_cells("figure9")


# ---------------------------------------------------------------------------- recorder
def test_recorder_scores_both_protocols_and_keeps_the_best_validation():
    split = X.synthetic_split()
    recorder = X.DualProtocolRecorder(split)
    num_items = split.num_items
    # an oracle ranks each user's held-out valid and test items first: every metric is 1
    valid_item = np.full(split.num_users, -1)
    valid_item[split.valid.users] = split.valid.items
    test_item = np.full(split.num_users, -1)
    test_item[split.test.users] = split.test.items

    def oracle(users):
        scores = torch.zeros(len(users), num_items)
        rows = torch.arange(len(users))
        scores[rows, torch.as_tensor(valid_item[users.cpu().numpy()])] = 2.0
        scores[rows, torch.as_tensor(test_item[users.cpu().numpy()])] = 1.0
        return scores

    def worst(users):
        return -oracle(users)

    first = recorder(10, worst)
    second = recorder(20, oracle)
    third = recorder(30, worst)
    assert second == pytest.approx(1.0) and first < 0.5 and third == first
    assert recorder.selected()["best_round"] == 20
    test = recorder.test_metrics()
    # test item at rank 2 behind the valid item in the full ranking? no: valid items are masked for test
    assert test["full/Recall@10"] == pytest.approx(1.0) and test["full/NDCG@10"] == pytest.approx(1.0)
    assert test["sampled/HR@10"] == pytest.approx(1.0)
    assert set(recorder.curve[0]) >= {"round", "valid/sampled/NDCG@10", "test/full/Recall@10"}


# ---------------------------------------------------------------------------- runners
@pytest.mark.parametrize("method, backbone", [("FedMF", None), ("FedNCF", None), ("FedPerGNN", None),
                                              ("Centralized", "NeuMF"), ("Centralized", "LightGCN"),
                                              ("PTF-FedRec", "NeuNCF"), ("FedKDRec", "LightGCN")])
def test_every_method_runs_on_synthetic_data(method, backbone):
    config = X.cell("synthetic", method, backbone=backbone, rounds=4, central_epochs=2, eval_every=2)
    result = X.run_cell(config, device="cpu")
    m = result["metrics"]
    for key in ("sampled/HR@10", "sampled/NDCG@10", "full/Recall@10", "full/NDCG@10"):
        assert 0.0 <= m[key] <= 1.0, key
    assert m["sampled/NDCG@10"] <= m["sampled/HR@10"] + 1e-9
    assert m["best_round"] in [row["round"] for row in result["extra"]["curve"]]
    if method != "Centralized":
        assert m["download_bytes_per_client_round"] > 0 and m["upload_bytes_per_client_round"] > 0
        assert len(result["extra"]["curve"]) == 2  # rounds 2 and 4
    if method == "FedKDRec":
        assert len(result["extra"]["history"]) == 4
        # prediction transfer moves far fewer bytes than a parameter model
        assert m["download_bytes_per_client_round"] <= 30 * 8


def test_fedkdrec_runs_are_reproducible():
    config = X.cell("synthetic", "FedKDRec", backbone="NeuMF", rounds=3, eval_every=3)
    a, b = X.run_cell(config, device="cpu"), X.run_cell(config, device="cpu")
    assert a["metrics"]["sampled/NDCG@10"] == b["metrics"]["sampled/NDCG@10"]
    assert a["extra"]["curve"] == b["extra"]["curve"]


# ---------------------------------------------------------------------------- lr selection
class _Record:
    def __init__(self, config, value):
        self.config, self.config_hash, self.seed = config, config_hash(config), config["seed"]
        self.metrics = {X.SELECTION: value}
        self.timestamp = "2026-01-01T00:00:00"


def test_selected_from_records_takes_the_best_validation_per_family(monkeypatch):
    from fedlib.reporting import results as R
    monkeypatch.setattr(R, "latest_records", lambda records: {r.config_hash: r for r in records})
    records = []
    for config in X.tuning_cells():
        value = {1e-3: 0.1, 5e-3: 0.3, 1e-2: 0.2}[config["lr"]]
        if X.family(config) == "FedMF":
            value = {1e-3: 0.4, 5e-3: 0.1, 1e-2: float("nan")}[config["lr"]]
        records.append(_Record(config, value))
    chosen = X.selected_from_records(records)
    assert chosen["FedMF"] == 1e-3
    assert all(lr == 5e-3 for fam, lr in chosen.items() if fam != "FedMF")
    assert set(chosen) == {"Centralized", "FedMF", "FedNCF", "FedPerGNN", "FedKDRec", "PTF-FedRec"}


def test_selected_learning_rates_match_the_recorded_tuning_runs():
    records = read_runs(X.PAPER, "paper")
    wanted = {config_hash(c) for c in X.tuning_cells()}
    done = [r for r in records if r.config_hash in wanted]
    derived = X.selected_from_records(done)
    families = {X.family(c) for c in X.tuning_cells()}
    complete = {f for f in families
                if sum(1 for r in done if X.family(r.config) == f) == len(X.LEARNING_RATES)}
    if not complete:
        pytest.skip("no family's tuning runs are recorded yet")
    for fam in complete:
        assert X.SELECTED[fam] == derived[fam], f"SELECTED[{fam!r}] disagrees with the recorded tuning runs"


def test_command_line_keeps_backboneless_baselines_and_chooses_where_to_train(monkeypatch):
    ran = {}
    monkeypatch.setattr(X, "run_grid", lambda cells, profile, **kwargs: ran.update(cells=cells, profile=profile, **kwargs))
    X.main(["table1", "--backbones", "LightGCN", "--dataset", "ML-1M", "--seeds", "0", "1", "--local-cluster", "2"])
    cells = ran["cells"]
    labels = {(c["method"], c["backbone"]) for c in cells}
    assert labels == {("FedMF", None), ("FedNCF", None), ("FedPerGNN", None), ("Centralized", "LightGCN"),
                      ("FedKDRec", "LightGCN")}                     # FedKDRec and its -m-c~s (PTF-FedRec)
    assert len(cells) == 2 * 6 and {c["dataset"] for c in cells} == {"ML-1M"}
    assert ran["cluster"] == X.grid.Cluster(local_workers=2, scheduler=None, threads=1)
    X.main(["ablation", "--methods=-m", "--backbones", "NeuMF"])                # labels starting with "-": "="
    assert [(c["variant"], c["backbone"], c["seed"]) for c in ran["cells"]] == [("-m", "NeuMF", 0)]
    assert ran["cluster"] is None                                               # in this process
    for gone in (["--worker", "1"], ["--workers", "2"]):                        # the old sharding is refused
        with pytest.raises(SystemExit):
            X.main(["table1", *gone])
    with pytest.raises(SystemExit):
        X.main(["table1", "--local-cluster", "2", "--scheduler", "tcp://127.0.0.1:8786"])  # one of the two
    with pytest.raises(SystemExit):
        X.main(["table1", "--backbones", "MF"])                     # not a backbone of the paper


def test_a_rate_chosen_once_per_family_is_judged_against_that_familys_grid():
    # one choice per family (on NeuMF) serves every backbone: each cell at it gets the tuning grid
    ptf = X.cell("ML-100K", "PTF-FedRec", backbone="LightGCN")
    assert ptf["lr"] == X.SELECTED["PTF-FedRec"] and X.tuning_grids(ptf) == {"lr": X.LEARNING_RATES}
    central = X.cell("ML-100K", "Centralized", backbone="LightGCN")
    assert X.tuning_grids(central) == {"lr": X.LEARNING_RATES}
    # another rate, or another budget (the headline's 400 rounds), is judged by its recorded neighbours
    assert X.tuning_grids(X.cell("ML-100K", "FedPerGNN", lr=0.02)) == {}
    assert X.tuning_grids(X.cell("ML-100K", "FedPerGNN", rounds=400)) == {}
    headline = X.grid_cells("headline_tuning")
    assert {(c["method"], c["rounds"]) for c in headline} == {("FedPerGNN", 400), ("FedPerGNN", 800), ("FedPerGNN", 1600),
                                                              ("Centralized", 300), ("FedKDRec", 400)}
    for c in headline:  # each grid holds the family's rate and reaches past the end it was chosen at
        if c["method"] == "FedPerGNN" and c["rounds"] > 400:
            continue  # FedPerGNN's longer runs, centred on what the shorter budget chose, not on [selected.lr]
        rates = sorted(h["lr"] for h in headline if X.family(h) == X.family(c) and h.get("backbone") == c.get("backbone")
                       and h["rounds"] == c["rounds"])
        chosen = X.SELECTED[X.family(c)]
        assert len(rates) >= 3 and chosen in rates
        if chosen == max(X.LEARNING_RATES):
            assert rates[-1] > chosen
        if chosen == min(X.LEARNING_RATES):
            assert rates[0] < chosen
