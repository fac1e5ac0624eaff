"""FedPCL-CDR grid: cells, every baseline's config mapping, synthetic runs, lr selection from records, the audit."""
import pytest
import torch

import fedlib.papers.fedpcl_cdr.experiment as X
from fedlib.reporting import append_run, read_runs
from fedlib.reporting.results import config_hash


def test_cells_validate_and_carry_method_specific_keys():
    fed = X.cell("Phone-Sport")
    assert fed["epsilon"] == 4.0 and fed["alpha"] == 0.01 and fed["num_clusters"] == 10 and "lr" not in fed
    assert X.fedpcl_config(fed).laplace_scale == pytest.approx(0.1)  # η = 2β/ε with β = 0.2
    base = X.cell("Phone-Sport", "NeuMF")
    assert "variant" not in base and base["lr"] == X.SELECTED_LR["NeuMF"] and base["rounds"] == fed["rounds"]
    assert X.cell("Phone-Sport", "FedNCF")["rounds"] == X.SPEC.choice("method", "FedNCF")["cell"]["rounds"] != fed["rounds"]
    assert X.method_label(X.cell("Book-Music", variant="w/o LDP")) == "w/o LDP"
    with pytest.raises(ValueError, match="unknown task"):
        X.cell("Movie-Books")
    with pytest.raises(ValueError, match="unknown method"):
        X.cell("Phone-Sport", "DisenCDR")
    with pytest.raises(ValueError, match="epsilon"):
        X.cell("Phone-Sport", epsilon=0)
    with pytest.raises(ValueError, match="unknown FedPCL-CDR variant"):
        X.cell("Phone-Sport", variant="w/o everything")
    with pytest.raises(TypeError, match=r"unknown cell setting\(s\) \['epsilon'\]"):
        X.cell("Phone-Sport", "NeuMF", epsilon=8.0)  # a FedPCL-CDR setting means nothing to a baseline


def test_the_spec_lists_agree_with_the_methods_and_variants():
    from fedlib.papers.fedpcl_cdr.method import VARIANTS

    assert X.METHODS == (*X.BASELINES, "FedPCL-CDR")  # Table 2's order: the baselines, then FedPCL-CDR
    assert X.SPEC.list("variants") == list(VARIANTS)
    assert set(X.SELECTED_LR) == set(X.BASELINES) and set(X.SPEC.list("privacy_methods")) <= set(X.METHODS)


@pytest.mark.parametrize("method", X.BASELINES)
def test_every_baseline_gets_its_size_epochs_lr_and_seed(method):
    config = X.baseline_config(X.cell("Phone-Sport", method, rounds=7, patience=3, seed=2, lr=0.01, dim=16))
    assert config.dim == 16 and config.patience == 3 and config.seed == 2 and config.lr == 0.01
    assert getattr(config, "epochs", getattr(config, "rounds", None)) == 7


def test_parts_cover_every_table_and_share_cells():
    available = X.available_tasks()
    assert set(X.SUBSTITUTE_TASKS) <= set(available)  # the shared data root holds the substitutes
    table2 = X.grid_cells("table2")
    assert len(table2) == len(available) * len(X.METHODS)
    ablation = X.grid_cells("ablation")
    shared = {X.config_hash(c) for c in table2} & {X.config_hash(c) for c in ablation}
    assert len(shared) == len(available)  # the full FedPCL-CDR row of each task
    assert {c["overlap_ratio"] for c in X.grid_cells("overlap")} == set(X.SPEC.list("overlap_ratios"))
    tuning = X.grid_cells("tuning")
    for method in X.BASELINES:  # the starting grid, plus whatever the recorded runs widened it by
        rates = {c["lr"] for c in tuning if c["method"] == method}
        assert set(X.SPEC.list("learning_rates")) <= rates <= set(X.LR_LADDER)
    with pytest.raises(ValueError, match="unknown part"):
        X.grid_cells("table9")


def test_a_synthetic_cell_records_scores_selection_and_the_attack():
    torch.set_num_threads(1)
    result = X.run_cell(X.cell("synthetic", rounds=3))
    metrics = result["metrics"]
    for domain in ("A", "B"):
        assert 0.2 < metrics[f"{domain}/test/HR@10"] <= 1.0
        assert metrics[f"{domain}/test/NDCG@10"] <= metrics[f"{domain}/test/HR@10"]
        assert metrics[f"{domain}/test/HR@2"] <= metrics[f"{domain}/test/HR@10"]
        assert metrics[f"attack/{domain}/normalised_mse"] > 0
    assert metrics["paper_epsilon"] == pytest.approx(4.0) and metrics["mechanism_epsilon"] == pytest.approx(32.0)
    assert [row["round"] for row in result["extra"]["curve"]] == [1, 2, 3]


def _record_tuning(method, scores):
    for lr, score in scores.items():
        append_run("fedpcl_cdr", "paper", X.cell("Phone-Sport", method, lr=lr), 0,
                   {"phone/valid/HR@10": score, "sport/valid/HR@10": score, "phone/test/HR@10": 0.9 - score}, 1.0)


def _rates(method):
    return [c["lr"] for c in X.tuning_cells(records=read_runs("fedpcl_cdr", "paper")) if c["method"] == method]


def test_learning_rates_are_selected_on_validation_and_the_grid_widens_at_its_edges(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    assert _rates("NeuMF") == [1e-3, 1e-2]  # nothing recorded: the starting grid
    _record_tuning("NeuMF", {1e-3: 0.30, 1e-2: 0.40})  # best at the top edge: try 3e-2 before choosing
    assert _rates("NeuMF") == [1e-3, 1e-2, 3e-2]
    assert X.selected_from_records(read_runs("fedpcl_cdr", "paper")) == {}
    _record_tuning("NeuMF", {3e-2: 0.35})  # 1e-2 is now inside the tried range: chosen
    assert _rates("NeuMF") == [1e-3, 1e-2, 3e-2]
    assert X.selected_from_records(read_runs("fedpcl_cdr", "paper")) == {"NeuMF": 1e-2}
    _record_tuning("PriCDR", {1e-3: 0.5, 1e-2: 0.2, 3e-4: 0.6, 1e-4: 0.7})  # down to the ladder's end
    assert _rates("PriCDR") == [1e-4, 3e-4, 1e-3, 1e-2]
    assert X.selected_from_records(read_runs("fedpcl_cdr", "paper")) == {"NeuMF": 1e-2, "PriCDR": 1e-4}
    _record_tuning("LightGCN", {1e-3: 0.5})  # a pending starting run: nothing widens, nothing is chosen
    assert _rates("LightGCN") == [1e-3, 1e-2] and "LightGCN" not in X.selected_from_records(
        read_runs("fedpcl_cdr", "paper"))
    frame = X.tuning_frame(read_runs("fedpcl_cdr", "paper")).set_index(["method", "lr"])
    assert frame.loc[("NeuMF", 1e-2), "chosen"] and not frame.loc[("NeuMF", 3e-2), "chosen"]
    assert frame.loc[("NeuMF", 3e-2), "valid_HR@10"] == pytest.approx(0.35)
    assert frame["chosen"].sum() == 2  # NeuMF and PriCDR; LightGCN's search is unfinished
    assert frame.loc[("LightGCN", 1e-2), "valid_HR@10"] != frame.loc[("LightGCN", 1e-2), "valid_HR@10"]  # NaN


def test_selected_learning_rates_match_the_recorded_tuning_runs():
    """SELECTED_LR holds exactly what selected_from_records derives from finished searches."""
    records = read_runs(X.PAPER, "paper")
    derived = X.selected_from_records(records)
    assert X.SELECTED_LR == derived, (f"SELECTED_LR {X.SELECTED_LR} disagrees with the recorded tuning runs {derived}: "
                                      "copy X.selected_from_records(read_runs('fedpcl_cdr', 'paper'))")


def test_the_code_audit_cell_selects_on_test():
    audit = X.grid_cells("audit")
    by_test = [c for c in audit if c.get("selection") == "test"]
    assert len(by_test) == 1
    code = by_test[0]
    assert (code["batches_per_round"], code["num_negatives"], code["patience"]) == (1, 98, 6)
    assert X.fedpcl_config(code).selection == "test"
    # every other cell keeps its hash: "selection" is only written when it is "test"
    assert "selection" not in X.cell("Phone-Sport") and X.fedpcl_config(X.cell("Phone-Sport")).selection == "valid"
    assert config_hash({k: v for k, v in code.items() if k != "selection"}) == config_hash(audit[0])
    with pytest.raises(ValueError, match="selection"):
        X.cell("Phone-Sport", selection="train")
    with pytest.raises(ValueError, match="baselines are always selected on validation"):
        X.cell("Phone-Sport", "NeuMF", selection="test")


def test_a_test_selected_synthetic_cell_reports_its_best_test_round():
    torch.set_num_threads(1)
    result = X.run_cell(X.cell("synthetic", rounds=3, patience=3, selection="test"))
    metrics, curve = result["metrics"], result["extra"]["curve"]
    best = max(curve, key=lambda row: row["test/HR@10"])["round"]
    assert metrics["selected_round"] == metrics["test_selected_round"] == best
    for domain in ("A", "B"):
        assert metrics[f"{domain}/test/HR@10"] == metrics[f"test_selected/{domain}/test/HR@10"]
    assert result["extra"]["review_branch"] is False  # the synthetic task has no review text
