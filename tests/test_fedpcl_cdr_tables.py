"""FedPCL-CDR tables from fabricated run records: substitute mapping, seed means, Imp, needs-download cells."""
import shutil

import numpy as np
import pytest

import fedlib.papers.fedpcl_cdr.experiment as X
import fedlib.papers.fedpcl_cdr.tables as T
from fedlib.paths import project_root
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE, append_run, read_runs
from fedlib.reporting.consistency import check_results_dir


@pytest.fixture()
def root(tmp_path, monkeypatch):
    source = project_root() / "paper_tables" / "fedpcl_cdr"
    shutil.copytree(source, tmp_path / "paper_tables" / "fedpcl_cdr")
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def scores(hr, seed=0, attack=None, domains=("phone", "sport")):
    out = {"selected_round": 5.0, "seconds": 1.0}
    for i, d in enumerate(domains):
        value = hr + 0.02 * seed + 0.01 * i
        out.update({f"{d}/test/HR@10": value, f"{d}/test/NDCG@10": value / 2, f"{d}/valid/HR@10": value,
                    f"test_selected/{d}/test/HR@10": value + 0.03})
        for n in (2, 4, 6, 8):
            out[f"{d}/test/HR@{n}"] = value * n / 10
        if attack is not None:
            out.update({f"attack/{d}/mse": attack, f"attack/{d}/normalised_mse": 0.9})
    return out


def record(config, values):
    append_run("fedpcl_cdr", "quick", config, config["seed"], values, 1.0, device="cpu", commit="abc1234")


def test_table2_maps_substitutes_averages_seeds_and_derives_imp(root):
    for seed in (0, 1):
        record(X.cell("Phone-Sport", "FedPCL-CDR", seed=seed), scores(0.50, seed))
        record(X.cell("Phone-Sport", "NeuMF", seed=seed), scores(0.40, seed))
        record(X.cell("Phone-Sport", "CL-DTCDR", seed=seed), scores(0.45, seed))
    records = read_runs("fedpcl_cdr", "quick")
    table = T.paper_table("table2_main", records, "quick")
    row = table[(table["domain"] == "Phone") & (table["method"] == "FedPCL-CDR") & (table["metric"] == "HR@10")
                & (table["stat"] == "score")].iloc[0]
    assert row["task"] == "Task 1 (Phone-Sport, Amazon)"
    assert row["value_ours"] == pytest.approx(0.51)  # mean of 0.50 and 0.52
    assert row["value_paper"] == pytest.approx(0.5501)
    assert row["n_seeds"] == 2 and "SUBSTITUTE" in row["note"]
    imp = table[(table["domain"] == "Sport") & (table["stat"] == "Imp (vs best baseline)")
                & (table["metric"] == "HR@10")].iloc[0]
    assert imp["value_ours"] == pytest.approx(5.0)  # 100 * (FedPCL-CDR - CL-DTCDR), percentage points
    assert "CL-DTCDR" in imp["note"]
    movie = table[(table["domain"] == "Movie") & (table["method"] == "NeuMF")]
    assert len(movie) and movie["value_ours"].isna().all()
    assert movie["note"].str.contains(NEEDS_DOWNLOAD_NOTE).all()
    phone_task2 = table[(table["task"].str.startswith("Task 2")) & (table["domain"] == "Phone")]
    assert phone_task2["note"].str.contains(NEEDS_DOWNLOAD_NOTE).all()


def test_tables_write_and_pass_the_consistency_check(root):
    record(X.cell("Phone-Sport", "FedPCL-CDR"), scores(0.5, attack=0.02))
    for variant in ("w/o LDP", "w/o CL"):
        record(X.cell("Phone-Sport", "FedPCL-CDR", variant=variant), scores(0.52))
    record(X.cell("Phone-Sport", "FedPCL-CDR", overlap_ratio=0.3), scores(0.4))
    record(X.cell("Phone-Sport", "NeuMF"), scores(0.55))  # a baseline: Table 2 derives its Imp rows
    tables = T.write_tables("quick", tasks=("Phone-Sport",))
    assert check_results_dir(root / "results" / "fedpcl_cdr" / "quick") == []
    t2 = tables["table2_main"]
    imp = t2[(t2["stat"] == "Imp (vs best baseline)") & t2["value_ours"].notna()]
    assert len(imp) == 4 and (imp["value_ours"] < 0).all()  # FedPCL-CDR below NeuMF in both domains
    fedpcl_id, neumf_id = X.config_hash(X.cell("Phone-Sport", "FedPCL-CDR")), X.config_hash(X.cell("Phone-Sport", "NeuMF"))
    assert (imp["run_ids"] == fedpcl_id).all() and imp["note"].str.contains(neumf_id).all()
    t1 = tables["table1_dataset_stats"]
    users = t1[(t1["domain"] == "Phone") & (t1["metric"] == "# Users")].iloc[0]
    assert users["value_ours"] == 4998 and users["value_paper"] == 5730
    t3 = tables["table3_ablation"]
    assert set(t3.dropna(subset=["value_ours"])["method"]) >= {"FedPCL-CDR", "w/o LDP", "w/o CL"}
    t4 = tables["table4_overlap_ratio"]
    ratio = t4[(t4["setting"] == "overlapping user ratio 30%") & (t4["method"] == "FedPCL-CDR")
               & (t4["domain"] == "Phone") & (t4["metric"] == "HR@10")].iloc[0]
    assert ratio["value_ours"] == pytest.approx(0.4)
    t5 = tables["table5_privacy_mse"]
    mse = t5[(t5["method"] == "FedPCL-CDR") & (t5["domain"] == "Phone") & (t5["metric"] == T.MSE_METRIC)].iloc[0]
    assert mse["value_ours"] == pytest.approx(0.02) and mse["value_paper"] == pytest.approx(8.72)


def test_figure_frames_read_sweeps_and_list_lengths(root):
    for e in (1.0, 4.0):
        record(X.cell("Phone-Sport", "FedPCL-CDR", epsilon=e), scores(0.4 + 0.01 * e))
    record(X.cell("Phone-Sport", "FedPCL-CDR", num_clusters=5), scores(0.3))
    records = read_runs("fedpcl_cdr", "quick")
    sweep = T.sweep_frame(records)
    eps = sweep[(sweep["parameter"] == "epsilon") & (sweep["domain"] == "Phone") & (sweep["metric"] == "HR@10")]
    assert eps.sort_values("setting")["value"].tolist() == pytest.approx([0.41, 0.44])
    # the default cell (epsilon 4, alpha 0.01, K 10) is a point of every sweep
    assert set(sweep["parameter"]) == {"epsilon", "alpha", "K"}
    assert sorted(set(sweep[sweep["parameter"] == "K"]["setting"])) == [5, 10]
    lengths = T.list_length_frame(records, tasks=("Phone-Sport",))
    phone = lengths[(lengths["domain"] == "Phone") & (lengths["metric"] == "HR")].sort_values("N")
    assert phone["N"].tolist() == [2, 4, 6, 8, 10]
    assert np.all(np.diff(phone["value"].to_numpy()) > 0)


def test_selection_gap_and_figures(root):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = X.cell("Phone-Sport", "FedPCL-CDR")
    record(config, scores(0.5, attack=0.02))
    for e in (1.0, 16.0):
        record(X.cell("Phone-Sport", "FedPCL-CDR", epsilon=e), scores(0.3 + 0.01 * e))
    records = read_runs("fedpcl_cdr", "quick")
    gap = T.selection_gap_frame(records, [config])
    hr = gap[gap["metric"] == "HR@10"]
    assert len(hr) == 2 and np.allclose(hr["gap"], 0.03)  # test-selected minus valid-selected
    fig = T.figure_sweeps(T.sweep_frame(records), "epsilon", "fig3_privacy_budget", profile="quick")
    assert fig is not None and (root / "figures" / "fedpcl_cdr" / "fig3_privacy_budget.png").exists()
    title = fig._suptitle.get_text()
    # the paper's 2β/η is not the Laplace mechanism's ε (√d = 8 times larger at d = 64): the title must not say it is
    assert "ε = 2β/η" not in title and "8×" in title and "ε as the paper states it" in fig.axes[0].get_xlabel()
    assert [tick.get_text() for tick in fig.axes[0].get_xticklabels()] == ["1", "4", "16"]
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1  # one legend, below the panels
    assert T.figure_sweeps(T.sweep_frame(records).iloc[0:0], "alpha") is None
    assert T.figure_list_length(T.list_length_frame(records, tasks=("Phone-Sport",))) is not None
    plt.close("all")


def test_selection_gap_marks_lower_bounds_and_pairs_the_code_rule_with_its_validation_twin(root):
    valid_cell = X.cell("Phone-Sport", "FedPCL-CDR", batches_per_round=1, rounds=500, patience=6, num_negatives=98)
    code_cell = X.cell("Phone-Sport", "FedPCL-CDR", batches_per_round=1, rounds=500, patience=6, num_negatives=98,
                       selection="test")
    record(valid_cell, scores(0.40))                  # its test-selected value is 0.43: a lower bound
    code = scores(0.47)
    code.update({k.replace("test_selected/", ""): v for k, v in code.items() if k.startswith("test_selected/")})
    record(code_cell, code)                           # the code's rule reports 0.50 (its test-selected round)
    gap = T.selection_gap_frame(read_runs("fedpcl_cdr", "quick"), [valid_cell, code_cell])
    hr = gap[(gap["metric"] == "HR@10") & (gap["domain"] == "Phone")].set_index("selection")
    assert hr.loc["valid", "test-selected is"] == T.LOWER_BOUND
    assert hr.loc["valid", "gap"] == pytest.approx(0.03)
    assert hr.loc["test", "test-selected is"] == T.CODE_RULE
    assert hr.loc["test", "valid-selected"] == pytest.approx(0.40)  # from the validation twin, same seed
    assert hr.loc["test", "test-selected"] == pytest.approx(0.50)
    assert hr.loc["test", "gap"] == pytest.approx(0.10)
    # without the twin recorded, the code-rule row has no validation score to compare with
    only_code = [r for r in read_runs("fedpcl_cdr", "quick") if r.config.get("selection") == "test"]
    alone = T.selection_gap_frame(only_code, [code_cell])
    assert len(alone)
    assert alone["valid-selected"].isna().all() and (alone["test-selected is"] == T.CODE_RULE).all()


def test_comparison_tasks_keep_the_best_kind_per_paper_task():
    assert T.comparison_tasks(["Phone-Sport", "Book-Music", "Book-Movie-Music", "Movie-Music"]) == (
        "Phone-Sport", "Book-Movie-Music", "Movie-Music")
    assert T.comparison_tasks(["Phone-Sport (original)", "Phone-Sport", "synthetic"]) == (
        "Phone-Sport (original)", "synthetic")
    assert T.comparison_tasks(["Elec-Cloth", "Book-Music"]) == ("Elec-Cloth", "Book-Music")
    assert set(T.TASK_NOTES) >= set(X.TASKS) and all(T.TASK_NOTES.values())  # every task's rows carry a note
