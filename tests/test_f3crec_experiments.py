"""F3CRec experiment grid and table builders: cells, cached base block, derived cells, provenance."""
import json
import math
import os
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.papers.f3crec import experiment as X
from fedlib.papers.f3crec import tables as T
from fedlib.baselines.continual.continual import FineTuning
from fedlib.reporting import read_runs
from fedlib.reporting.consistency import check_results_table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"rounds": 2, "patience": 2, "seed": 0}


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A throw-away project root (results go there) that sees the real paper tables."""
    (tmp_path / "paper_tables").symlink_to(os.path.join(REPO, "paper_tables"))
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def test_cell_rejects_unknown_names_with_the_valid_choices():
    with pytest.raises(ValueError, match="unknown dataset 'ML-1M'.*ML-100K"):
        X.cell("ML-1M", "FedMF", "FT")
    with pytest.raises(ValueError, match="unknown backbone 'LightGCN'.*FedMF"):
        X.cell("ML-100K", "LightGCN", "FT")
    with pytest.raises(ValueError, match="unknown method 'EWC'"):
        X.cell("ML-100K", "FedMF", "EWC")


def test_cell_defaults_follow_the_paper_settings():
    c = X.cell("ML-Latest-Small", "FedMF", "F3CRec", tuned=False)
    assert c["rounds"] == 150 and c["patience"] == 30 and c["split"] == "chronological"
    assert c["method_params"] == {"lambda_kd": 0.1, "eps": 5e-5, "top_n": 30, "beta": 0.9}
    ablation = X.cell("ML-100K", "FedMF", "w/o i.t.m", tuned=False)["method_params"]
    assert ablation["itemwise"] is False and ablation["eps"] == 6e-3
    # tuned cells (the default) take the validation choice; ablations inherit F3CRec's values
    tuned = X.cell("ML-100K", "FedMF", "w/o i.t.m")["method_params"]
    assert tuned["itemwise"] is False and tuned["eps"] == X.SELECTED["ML-100K"]["F3CRec"]["eps"]
    # a changed setting changes the configuration (and so its hash / cache entry)
    assert X.config_hash(X.cell("ML-100K", "FedMF", "FT")) != X.config_hash(X.cell("ML-100K", "FedMF", "FT", seed=1))


def test_a_backbone_runs_at_its_own_rate_where_one_was_chosen():
    tuned = X.backbone_choices("ML-100K", "FedNCF")["lr"]
    assert X.cell("ML-100K", "FedNCF", "F3CRec")["backbone_params"]["lr"] == tuned
    assert X.cell("ML-100K", "FedNCF", "F3CRec", tuned=False)["backbone_params"]["lr"] == tuned  # sweeps run at it
    assert X.cell("ML-100K", "FedNCF", "FT", backbone_lr=0.2)["backbone_params"]["lr"] == 0.2  # the lr sweep
    spec_rate = X.SPEC.choice("backbone", "FedNCF")["params"]["lr"]
    assert X.cell("Lastfm-2K", "FedNCF", "F3CRec")["backbone_params"]["lr"] == spec_rate  # none chosen there
    with pytest.raises(ValueError, match="positive number"):
        X.cell("ML-100K", "FedNCF", "FT", backbone_lr=-1.0)


def test_reg_lambda_pulls_a_fixed_fraction_per_step():
    c = X.cell("ML-100K", "FedNCF", "Reg", tuned=False)
    assert c["backbone_params"]["lr"] == X.backbone_choices("ML-100K", "FedNCF")["lr"]  # its own rate on ML-100K
    lr_item = c["backbone_params"]["lr"] * 1152 * 170.0
    assert X.reg_lambda(c, 1152) == pytest.approx(X.REG_PULL / (2 * lr_item))
    # one SGD step on λ‖q − q_old‖² moves q by 2 λ lr_item (q − q_old) = pull · (q − q_old)
    assert 2 * X.reg_lambda(c, 1152) * lr_item == pytest.approx(X.REG_PULL)


def test_upload_noise_wrapper_spares_block_zero():
    stream = X.load_stream(X.cell("synthetic", "FedMF", "FT", **TINY))
    config = X.cell("synthetic", "FedMF", "F3CRec", upload_noise=0.3, **TINY)
    method = X.make_method(config, stream[1].num_items)
    assert isinstance(method, X.WithUploadNoise) and method.scale == 0.3

    class Ctx:
        previous = None
        base_method = X.make_backbone(config).make_method(X.make_backbone(config).make_model(5, 7))

    assert method.make_method(Ctx()).upload_noise is None


def test_base_block_is_trained_once_and_reloaded(tmp_path):
    config = X.cell("synthetic", "FedMF", "FT", **TINY)
    stream = X.load_stream(config)
    first = X.base_block(config, stream, tmp_path, "cpu")
    files = list((tmp_path / "base").glob("*.pt"))
    assert len(files) == 1
    again = X.base_block(X.cell("synthetic", "FedMF", "KD", **TINY), stream, tmp_path, "cpu")  # other method, same base
    for name, value in first.selected_state.global_state.items():
        assert torch.equal(value, again.selected_state.global_state[name])
    assert first.test_metrics == again.test_metrics and first.history == again.history
    assert again.method == "FT" and again.artifacts["num_items"] == stream[0].num_items
    # the file holds plain values and tensors (nothing is unpickled from it)
    assert set(torch.load(files[0], weights_only=True)) == {"config", "run"}


class _OldBlockResult:  # stands for the pickled BlockResult objects older versions cached
    def __init__(self, test_metrics):
        self.test_metrics = test_metrics


@pytest.mark.parametrize("stale", ["pickled object", "other layout", "other key", "truncated"])
def test_base_block_trains_again_over_a_cache_file_it_cannot_read(tmp_path, stale):
    config = X.cell("synthetic", "FedMF", "FT", **TINY)
    stream = X.load_stream(config)
    fresh = X.base_block(config, stream, None, "cpu")
    path = tmp_path / "base" / f"{X.config_hash(X.base_config(config))}.pt"
    path.parent.mkdir()
    if stale == "pickled object":
        torch.save(_OldBlockResult({"NDCG@20": 0.5}), path)
    elif stale == "other layout":
        torch.save({"config": X.base_config(config), "run": {"format": "fedlib.continual.block-run/0"}}, path)
    elif stale == "other key":
        other = X.base_block(X.cell("synthetic", "FedMF", "FT", **{**TINY, "seed": 1}), stream, tmp_path, "cpu")
        (path.parent / f"{X.config_hash(X.base_config({**config, 'seed': 1}))}.pt").replace(path)
        assert other.test_metrics != fresh.test_metrics
    else:
        path.write_bytes(b"PK\x03\x04")
    with pytest.warns(UserWarning, match="not a block-0 run this version can read.*training block 0 again"):
        result = X.base_block(config, stream, tmp_path, "cpu")
    assert result.test_metrics == fresh.test_metrics and result.history == fresh.history
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file was replaced: read back without a warning
        assert X.base_block(config, stream, tmp_path, "cpu").test_metrics == fresh.test_metrics


def test_user_groups_split_by_mean_shift():
    analysis = {"users": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], "shift_users": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 42],
                "shift_mean": [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 0.0, 100.0]}
    groups = T.user_groups(analysis, fraction=0.2)
    assert sorted(groups["static user"].tolist()) == [1, 9]  # shifts 1 and 0; user 42 is not in D0's test
    assert sorted(groups["dynamic user"].tolist()) == [2, 6]


def test_grid_records_runs_and_tables_are_consistent(project):
    cells = [c for c in X.grid_cells("table2", ["synthetic"], **TINY)
             if c["backbone"] == "FedMF" and c["method"] in ("FT", "KD", "Reg", "F3CRec")]
    cells += X.grid_cells("ablation", ["synthetic"], **TINY)[:1] + X.grid_cells("analysis", ["synthetic"], **TINY)[:1]
    frame = X.run_cells(cells, "smoke")
    assert len(frame) == len(cells)
    records = read_runs("f3crec", "smoke")
    assert len(records) == len(cells)
    tables = T.all_tables(records, "smoke", ["synthetic"], TINY)
    table2 = tables["table2"]
    ours = table2[table2["dataset"] == "synthetic"].set_index(["method", "metric", "block"])["value_ours"]
    for method in ("FT", "KD", "Reg", "F3CRec"):
        parts = [ours[(method, "N@20", b)] for b in ("D1", "D2", "D3")]
        assert ours[(method, "N@20", "Avg")] == pytest.approx(np.mean(parts))
    assert ours[("F3CRec", "N@20", "Improv")] == pytest.approx(
        100 * (ours[("F3CRec", "N@20", "Avg")] / ours[("FT", "N@20", "Avg")] - 1))
    # paper cells of real datasets stay visible, with the reason they are empty
    hetrec = table2[(table2["dataset"] == "HetRec2011") & (table2["value_paper"].notna())]
    assert (hetrec["note"] == "dataset needs download").all() and hetrec["value_ours"].isna().all()
    # every table passes the results-file checks, provenance included
    from fedlib.reporting.results import latest_records
    runs = latest_records(records)
    for table_id, table in tables.items():
        problems = check_results_table(table, table_id=table_id, runs=runs, paper="f3crec")
        assert problems == [], (table_id, problems[:3])
    # the analysis cell produced the user and item analyses
    analysis = [r for r in records if r.config.get("analysis")][0]
    assert {"users", "a00", "a10", "shift_users", "shift_mean"} <= set(analysis.extra["users_D0"])
    items = analysis.extra["items"]
    assert len(items["static_by_transition"]) == 3 and all(v >= 0 for v in items["dynamic_by_transition"])


def test_item_analysis_on_identical_blocks_is_zero():
    config = X.cell("synthetic", "FedMF", "FT", **TINY)
    stream = X.load_stream(config)
    base = X.base_block(config, stream, None, "cpu")
    backbone = X.make_backbone(config)
    result = X.item_analysis(stream, backbone, [base, base])
    assert result["static_items"] == 0.0 and result["dynamic_items"] == 0.0
    assert not math.isnan(result["static_items"])


def test_run_cell_metrics_names():
    result = X.run_cell(X.cell("synthetic", "FedMF", "FT", **TINY), device="cpu")
    metrics = result["metrics"]
    for block in ("D0", "D1", "D2", "D3"):
        assert {f"N@20/{block}", f"R@20/{block}", f"best_round/{block}"} <= set(metrics)
    assert metrics["N@20/Avg"] == pytest.approx(np.mean([metrics[f"N@20/D{t}"] for t in (1, 2, 3)]))
    assert len(result["extra"]["accuracy"]["N@20"]) == 4
    assert isinstance(FineTuning(), X.ContinualMethod)
    assert isinstance(pd.DataFrame(result["extra"]["accuracy"]["N@20"]), pd.DataFrame)
    # each incremental block's per-round curves: one value per round run, the selected round's
    # validation N@20 among them
    extra = result["extra"]
    for t in (1, 2, 3):
        losses, valid = extra[f"train_loss per round/D{t}"], extra[f"valid N@20 per round/D{t}"]
        assert len(losses) == len(valid) == metrics[f"rounds/D{t}"]
        assert all(isinstance(v, float) and v > 0 for v in losses)
        best = int(metrics[f"best_round/D{t}"])
        assert valid[best - 1] == pytest.approx(metrics[f"valid N@20/D{t}"])
        json.dumps([losses, valid], allow_nan=False)  # plain JSON in runs.jsonl


def test_grid_resumes_from_recorded_runs_without_a_cache(project, tmp_path, monkeypatch):
    """A fresh clone has runs.jsonl but no cache folder: recorded cells are not trained again."""
    cells = [X.cell("synthetic", "FedMF", "FT", **TINY)]
    first = X.run_grid(cells, "smoke", cache_dir=tmp_path / "cache_a", progress=False)
    assert len(read_runs("f3crec", "smoke")) == 1

    def must_not_train(*args, **kwargs):
        raise AssertionError("a recorded cell was trained again")

    monkeypatch.setattr(X, "run_cell", must_not_train)
    again = X.run_grid(cells, "smoke", cache_dir=tmp_path / "cache_b", progress=False)
    assert len(read_runs("f3crec", "smoke")) == 1  # nothing appended
    assert again["metrics.N@20/Avg"].tolist() == pytest.approx(first["metrics.N@20/Avg"].tolist())


def test_selected_hyperparameters_are_what_the_recorded_sweep_selects():
    """SELECTED is not hand-picked: it is the validation-best value of the committed tuning runs."""
    from fedlib.reporting.results import runs_path

    path = runs_path("f3crec", "paper")
    if not path.exists():
        pytest.skip(f"no recorded paper-profile runs at {path}")
    records = read_runs("f3crec", "paper")
    assert X.select_hyperparameters(records, X.OFFLINE_DATASETS) == X.SELECTED
    for dataset, choice in X.SELECTED.items():
        # the selection reaches the cells: a tuned F3CRec cell carries the selected ε, λ_KD, β,
        # its backbone's own where it has them (and its backbone's own learning rate)
        for backbone in X.BACKBONES:
            own = choice.get("backbones", {}).get(backbone, {})
            expected = own.get("F3CRec", choice["F3CRec"])
            config = X.cell(dataset, backbone, "F3CRec")
            assert {k: config["method_params"][k] for k in expected} == expected
            if "lr" in own:
                assert config["backbone_params"]["lr"] == own["lr"]
    assert X.SELECTED["ML-100K"]["backbones"]["FedNCF"]["F3CRec"] != X.SELECTED["ML-100K"]["F3CRec"]  # tuned apart
