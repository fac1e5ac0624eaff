"""FedCSR grid: cell validation, sizes, parts, variant flags, and every method on the synthetic task."""
import math

import pytest
import torch

import fedlib.papers.fedcsr.experiment as X
from fedlib.papers.fedcsr.model import FedCSRModel
from fedlib.baselines.sequential.sequence_training import METRICS
from fedlib.reporting.results import config_hash

TINY = dict(dim=8, rounds=2, patience=2, local_epochs=1, batch_size=64, maxlen=6)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("FEDLIB_DEVICE", "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cells_validate_their_arguments():
    with pytest.raises(ValueError, match="unknown dataset"):
        X.cell("Phone-Sport")
    with pytest.raises(ValueError, match="unknown method"):
        X.cell("Food-Kitchen", "SASRec")
    with pytest.raises(ValueError, match="unknown variant"):
        X.cell("Food-Kitchen", variant="w/o everything")
    with pytest.raises(ValueError, match="applies to method 'FedCSR' only"):
        X.cell("Food-Kitchen", "C2DSR", variant="w/o SCL")
    with pytest.raises(ValueError, match="alpha"):
        X.cell("Food-Kitchen", alpha=1.5)
    with pytest.raises(ValueError, match="dim"):
        X.cell("Food-Kitchen", dim=1)
    with pytest.raises(ValueError, match="rounds"):
        X.cell("Food-Kitchen", rounds=0)
    with pytest.raises(ValueError, match="lr"):
        X.cell("Food-Kitchen", lr=0.0)


def test_cell_defaults_follow_the_paper_and_the_stated_sizes():
    main = X.cell("Food-Kitchen")
    assert main["dim"] == 256 and main["rounds"] == 20 and main["patience"] == 20
    assert main["sampled_negatives"] == 1000 and X.cell("synthetic")["sampled_negatives"] is None
    assert X.cell("Food-Kitchen", sampled_negatives=None)["sampled_negatives"] is None
    with pytest.raises(ValueError, match="sampled_negatives"):
        X.cell("Food-Kitchen", sampled_negatives=0)
    assert main["alpha"] == 0.3 and main["num_negatives"] == 999 and main["variant"] == "FedCSR"
    base = X.cell("Movie-Book", "C2DSR")
    assert base["dim"] == X.SMALL_DIM == 64 and "variant" not in base and "alpha" not in base
    assert X.cell("Food-Kitchen", "Individual")["dim"] == X.SMALL_DIM
    assert X.cell("synthetic")["num_negatives"] == 20
    with pytest.raises(TypeError, match="unknown cell setting"):
        X.cell("Food-Kitchen", rounds_per_epoch=3)
    assert config_hash(X.cell("Food-Kitchen", dim=256)) != config_hash(X.cell("Food-Kitchen", dim=64))
    assert X.method_label(X.cell("Food-Kitchen", variant="w/o MCL")) == "w/o MCL"
    assert X.method_label(X.cell("Food-Kitchen", "PiNet")) == "PiNet"


def test_variants_map_to_flags_of_the_one_implementation():
    hashes = {config_hash(X.cell("Food-Kitchen", variant=v)) for v in X.VARIANTS}
    assert len(hashes) == len(X.VARIANTS)
    model, train = X.fedcsr_configs(X.cell("Food-Kitchen", variant="w/o SCL & MCL", dim=16))
    assert (model.use_mcl, model.use_scl, model.use_unified, model.use_single) == (False, False, True, True)
    assert model.dim == 16 and train.rounds == 20 and train.patience == 20 and model.sampled_negatives == 1000
    model, _ = X.fedcsr_configs(X.cell("Food-Kitchen", variant="w/o unified"))
    assert not model.use_unified and model.use_single and model.use_mcl
    _, train = X.fedcsr_configs(X.cell("Food-Kitchen", variant="code: central graph"))
    assert train.central_graph and not train.shared_optimizer
    _, train = X.fedcsr_configs(X.cell("Food-Kitchen", variant="code: shared Adam"))
    assert train.shared_optimizer and not train.central_graph
    model, train = X.fedcsr_configs(X.cell("Food-Kitchen", variant="code: all"))
    assert train.central_graph and train.shared_optimizer and not (model.use_mcl or model.use_scl)
    model, _ = X.fedcsr_configs(X.cell("Food-Kitchen", alpha=0.7))
    assert model.alpha == 0.7
    model, _ = X.fedcsr_configs(X.cell("Food-Kitchen", scl_hidden_factor=0.25, dim=64))
    assert model.scl_hidden_factor == 0.25 and FedCSRModel(3, 2, model).transform[0].out_features == 16


def test_parts_have_their_sizes_and_share_cells():
    sizes = {part: len(X.grid_cells(part)) for part in X.PARTS}
    assert sizes == {"table2": 20, "ablation": 12, "alpha": 7, "hidden": 5, "individual": 3, "audit": 5,
                     "headline": 3, "headline_lr": 12}
    headline = X.grid_cells("headline") + X.grid_cells("headline_lr")
    assert {(c["method"], c["dim"], c["rounds"], c["patience"]) for c in headline} == {  # the paper's budget
        (m, 64, 100, 20) for m in ("FedCSR", "PiNet", "CLSR")}
    assert sorted({c["lr"] for c in headline}) == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]  # 1e-3 (the code's) is interior
    assert X.headline_rates("PiNet") == (5e-4, 1e-3, 2e-3, 4e-3)                # widened (its pick was 2e-3)
    assert X.headline_rates("CLSR") == (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)           # widened twice (2e-3, then 4e-3)
    assert X.headline_rates("FedCSR") == X.HEADLINE_RATES
    with pytest.raises(ValueError, match="not in part headline_lr"):
        X.headline_rates("TiSASRec")
    # the headline runs each method at its chosen rate, and that rate's seed-0 run is headline_lr's
    tuning = {X.config_hash(c) for c in X.grid_cells("headline_lr")}
    assert {(c["method"], c["lr"]) for c in X.grid_cells("headline")} == set(X.HEADLINE_LR.items())
    assert all(X.config_hash(c) in tuning for c in X.grid_cells("headline"))
    table2 = X.grid_cells("table2")
    fedcsr_dims = sorted(c["dim"] for c in table2 if c["method"] == "FedCSR" and c["dataset"] == "Food-Kitchen")
    assert fedcsr_dims == [64, 256]
    assert all(c["dim"] == 64 for c in table2 if c["method"] in X.BASELINES)
    assert {c["method"] for c in table2} == {"FedCSR", *X.BASELINES}
    assert sorted(c["alpha"] for c in X.grid_cells("alpha")) == list(X.ALPHAS)
    hidden = X.grid_cells("hidden")
    assert [c.get("scl_hidden_factor", 2.0) for c in hidden] == [0.25, 0.5, 1.0, 2.0, 4.0]
    assert {c["dim"] for c in hidden} == {X.SMALL_DIM} and "scl_hidden_factor" not in hidden[3]  # 2.0: the default
    every = [c for part in X.PARTS for c in X.grid_cells(part)]
    assert len(X.unique_cells(every)) == 46 + 12  # FedCSR@64 / @256 rows are shared between parts, and headline's with headline_lr
    with pytest.raises(ValueError, match="unknown part"):
        X.grid_cells("figure9")


def _check_metrics(metrics, domains, prefix=""):
    for d in domains:
        for m in METRICS:
            for key in (f"{prefix}{d}/test/{m}", f"{prefix}{d}/valid/{m}"):
                assert math.isfinite(metrics[key]) and 0.0 <= metrics[key] <= 1.0, (key, metrics[key])


@pytest.mark.parametrize("method", X.METHODS)
def test_every_method_runs_on_the_synthetic_task(method):
    out = X.run_cell(X.cell("synthetic", method, **TINY))
    metrics, extra = out["metrics"], out["extra"]
    domains = extra["domains"]
    _check_metrics(metrics, domains)
    _check_metrics(metrics, domains, "test_selected/")
    assert 1 <= metrics["selected_round"] <= 2 and 1 <= metrics["test_selected_round"] <= 2
    assert 1 <= len(extra["curve"]) == metrics["rounds_run"] <= 2 and metrics["seconds"] > 0
    for d in domains:   # full ranking (every item of the domain, 30 here) is harder than 1 + 20 candidates
        assert 0 < metrics[f"full/{d}/test/MRR"] <= 1 and metrics[f"full/{d}/test/HR@10"] <= 1
    assert sum(metrics[f"full/{d}/test/MRR"] for d in domains) < sum(metrics[f"{d}/test/MRR"] for d in domains)
    for d in domains:   # float scores of a trained model: no ties, so counting them against the GT changes nothing
        for m in METRICS:
            assert metrics[f"{X.TIES_AGAINST_PREFIX}{d}/test/{m}"] == pytest.approx(metrics[f"{d}/test/{m}"], abs=1e-9)
    if method == "Individual":
        assert metrics["bytes_per_round"] == 0
    else:
        assert metrics["bytes_per_round"] > 0
    if method in ("FedCSR", "Individual"):  # Table 9 / Figure 4 compare them platform by platform
        split = X.load_split("synthetic", X.cell("synthetic", method, **TINY)["num_negatives"], 0)
        platforms = range(len(split.platforms))
        assert len(platforms) > 1
        for d in domains:
            counts = [metrics[f"platform{k}/{d}/test/count"] for k in platforms]
            per_platform = [metrics[f"platform{k}/{d}/test/MRR"] for k in platforms]
            assert all(0 <= v <= 1 for v, c in zip(per_platform, counts) if c > 0)
            assert all(math.isnan(v) for v, c in zip(per_platform, counts) if c == 0)  # no rows: no score
            # the platforms' rows are the pooled test rows, so their count-weighted mean is the pooled score
            pooled = sum(v * c for v, c in zip(per_platform, counts) if c > 0) / sum(counts)
            assert pooled == pytest.approx(metrics[f"{d}/test/MRR"], abs=1e-9)
    else:
        assert not any(key.startswith("platform") for key in metrics)


def test_ties_against_the_ground_truth_expose_a_model_that_scores_everything_alike(monkeypatch):
    """A model that gives every candidate one score ranks first under the reported (optimistic)
    rule, and at the bottom once ties count against it: the recorded pair shows the difference."""
    def flat_scores(self, inputs, candidates, gt_domain):
        return torch.zeros(candidates.shape, dtype=torch.float32, device=candidates.device)  # (B, C) all tied

    monkeypatch.setattr(FedCSRModel, "score", flat_scores)
    metrics = X.run_cell(X.cell("synthetic", "FedCSR", **TINY))["metrics"]
    for d in ("A", "B"):
        assert metrics[f"{d}/test/MRR"] == 1.0 and metrics[f"{d}/test/HR@1"] == 1.0
        assert metrics[f"{X.TIES_AGAINST_PREFIX}{d}/test/MRR"] == pytest.approx(1 / (1 + 20))
        assert metrics[f"{X.TIES_AGAINST_PREFIX}{d}/test/HR@10"] == 0.0


@pytest.mark.parametrize("variant", [v for v in X.VARIANTS if v != "FedCSR"])
def test_every_variant_runs_on_the_synthetic_task(variant):
    out = X.run_cell(X.cell("synthetic", variant=variant, **{**TINY, "rounds": 1}))
    _check_metrics(out["metrics"], out["extra"]["domains"])


def test_ablation_flags_change_the_trained_loss():
    kw = {**TINY, "rounds": 1}
    full = X.run_cell(X.cell("synthetic", **kw))["extra"]["curve"][0]
    no_cl = X.run_cell(X.cell("synthetic", variant="w/o SCL & MCL", **kw))["extra"]["curve"][0]
    assert "loss/mcl" in full and "loss/scl" in full
    assert "loss/mcl" not in no_cl and "loss/scl" not in no_cl


def test_progress_is_called_once_per_round_for_every_method_family():
    for method in ("FedCSR", "Individual", "TiSASRec"):
        rounds_seen = []
        X.run_cell(X.cell("synthetic", method, **TINY), progress=rounds_seen.append)
        assert rounds_seen == [1, 2], method


def test_command_line_filters_cells_and_adds_seeds(monkeypatch):
    ran = {}
    monkeypatch.setattr(X, "run_grid", lambda cells, profile, **kwargs: ran.update(cells=cells, profile=profile, **kwargs))
    X.main(["table2", "--methods", "FedCSR", "TiSASRec", "--datasets", "Food-Kitchen", "--dims", "64",
            "--seeds", "0", "1"])
    cells = ran["cells"]
    assert ran["profile"] == "paper" and len(cells) == 4           # FedCSR@64 and TiSASRec@64, two seeds
    assert {(c["method"], c["dim"], c["dataset"]) for c in cells} == {("FedCSR", 64, "Food-Kitchen"),
                                                                       ("TiSASRec", 64, "Food-Kitchen")}
    assert sorted(c["seed"] for c in cells) == [0, 0, 1, 1]
    assert ran["rerun"] is False
    X.main(["individual", "--methods", "FedCSR", "--rerun"])
    assert ran["rerun"] is True and [c["method"] for c in ran["cells"]] == ["FedCSR"]
    with pytest.raises(SystemExit):
        X.main(["individual", "--rerun", "--pending"])               # one trains, the other does not
    with pytest.raises(SystemExit):
        X.main(["table2", "--datasets", "Phone-Sport"])              # not a FedCSR scenario


class _Killed(RuntimeError):
    pass


@pytest.mark.parametrize("method", ["FedCSR", "Individual", "Centralized", "TiSASRec"])
def test_a_killed_cell_resumes_to_the_uninterrupted_result(tmp_path, method):
    """Killed in round 3 after the round-2 snapshot, a fresh run_cell continues to the same record.

    One cell per algorithm: FedCSR (federated), Individual (per-platform models and Adams),
    Centralized (FedCSR on one pooled platform) and a FedProx baseline (TiSASRec, with dropout).
    """
    import json

    from fedlib.engine import Checkpointer

    config = X.cell("synthetic", method, **{**TINY, "rounds": 4, "patience": 4})
    full = X.run_cell(config)

    def kill_in_round_3(round_number):
        if round_number == 3:
            raise _Killed

    with pytest.raises(_Killed):
        X.run_cell(config, progress=kill_in_round_3, checkpointer=Checkpointer(tmp_path, name="cell", every=2))
    again = Checkpointer(tmp_path, name="cell", every=2)
    resumed = X.run_cell(config, checkpointer=again)
    assert resumed["extra"].pop("resumed_at") == [2]
    assert resumed["metrics"]["seconds"] >= again.earlier_seconds > 0

    def comparable(result):
        metrics = {k: v for k, v in result["metrics"].items() if k != "seconds"}
        curve = [{k: v for k, v in row.items() if k != "seconds"} for row in result["extra"]["curve"]]
        return json.loads(json.dumps({"metrics": metrics, "extra": {**result["extra"], "curve": curve}}))

    assert comparable(resumed) == comparable(full)


def test_the_paper_grid_checkpoints_its_cells(monkeypatch):
    seen = {}
    monkeypatch.setattr(X.grid, "run_recorded_grid", lambda *args, **kwargs: seen.update(kwargs))
    X.run_grid([X.cell("synthetic", **TINY)], "paper", progress=False)
    assert seen["checkpoint_every_s"] == X.CHECKPOINT_EVERY_S > 0


def test_a_scenario_without_data_is_refused_naming_the_runnable_ones():
    # Entertainment-Education is a dataset choice (Table 8 lists its paper rows) without a registry entry
    with pytest.raises(ValueError, match="Food-Kitchen, Movie-Book and 'synthetic'"):
        X.load_split("Entertainment-Education")


def test_headline_rates_are_what_validation_chose_in_the_recorded_runs():
    """The spec's headline rows hold, for every method whose whole rate grid is recorded, the rate
    headline_lr_from_records derives from results/fedcsr/runs.jsonl (no method is left out)."""
    from fedlib.reporting import read_runs

    derived = X.headline_lr_from_records(read_runs(X.PAPER, "paper"))
    assert set(derived) == set(X.HEADLINE_LR) == set(X.SPEC.list("headline_methods"))
    for method, rate in derived.items():
        assert rate is None or rate == X.HEADLINE_LR[method], (method, rate, X.HEADLINE_LR[method])


def test_a_widened_rate_grid_extends_the_edge_validation_chose():
    """A rate of the spec's headline_wider is one step (x2 or /2) beyond the rates below it, on the
    side where the recorded runs of those rates chose their edge: widen only where validation asked."""
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import latest_records

    known = latest_records(read_runs(X.PAPER, "paper"))
    wider = X.SPEC.list("headline_wider")
    assert wider, "no widened grid: drop this test with the spec's headline_wider"
    for row in wider:
        method, rate = row["method"], float(row["lr"])
        assert rate not in X.HEADLINE_RATES and rate in X.headline_rates(method)
        inner = [r for r in X.headline_rates(method) if (r < rate if rate > max(X.HEADLINE_RATES) else r > rate)]
        scores = {}
        for lr in inner:
            [config] = [c for c in X.grid_cells("headline_lr") if c["method"] == method and c["lr"] == lr]
            assert X.config_hash(config) in known, f"{method} at {lr:g} is not recorded, so nothing asked for {rate:g}"
            scores[lr] = X.headline_validation(known[X.config_hash(config)].metrics, ("Food", "Kitchen"))
        edge = max(inner) if rate > max(inner) else min(inner)
        assert rate == pytest.approx(2 * edge if rate > edge else edge / 2)
        assert max(scores, key=scores.get) == edge, (method, scores)


def test_headline_lr_from_records_waits_for_the_whole_grid_and_breaks_ties_to_the_smaller_rate():
    from types import SimpleNamespace

    def run(config, food, kitchen):
        return SimpleNamespace(config_hash=X.config_hash(config), timestamp="", metrics={
            "Food/valid/MRR": food, "Kitchen/valid/MRR": kitchen})

    cells = {(c["method"], c["lr"]): c for c in X.grid_cells("headline_lr")}
    records = [run(cells["FedCSR", 5e-4], 0.10, 0.02), run(cells["FedCSR", 1e-3], 0.05, 0.09),  # means .06, .07
               run(cells["FedCSR", 2e-3], 0.08, 0.04),
               run(cells["PiNet", 5e-4], 0.05, 0.05), run(cells["PiNet", 2e-3], 0.09, 0.09),   # 1e-3 missing
               run(cells["CLSR", 5e-4], 0.04, 0.04), run(cells["CLSR", 1e-3], 0.02, 0.06),    # a tie at .04
               run(cells["CLSR", 2e-3], 0.03, 0.03), run(cells["CLSR", 4e-3], 0.01, 0.01),
               run(cells["CLSR", 8e-3], 0.02, 0.02)]
    assert X.headline_lr_from_records(records) == {"FedCSR": 1e-3, "PiNet": None, "CLSR": 5e-4}
    # CLSR's grid widened twice: without its last rate there is no choice
    assert X.headline_lr_from_records(records[:-1])["CLSR"] is None
    # π-Net's widened grid: its three common rates are not enough, the fourth decides
    records += [run(cells["PiNet", 1e-3], 0.06, 0.06)]
    assert X.headline_lr_from_records(records)["PiNet"] is None                       # 4e-3 not recorded
    assert X.headline_lr_from_records(records + [run(cells["PiNet", 4e-3], 0.07, 0.07)])["PiNet"] == 2e-3
    assert X.headline_lr_from_records(records + [run(cells["PiNet", 4e-3], 0.10, 0.09)])["PiNet"] == 4e-3
    assert math.isnan(X.headline_validation({"Food/valid/MRR": 0.1}, ("Food", "Kitchen")))  # a missing domain
    # a domain without a finite MRR is left out, as training's selection metric does
    assert X.headline_validation({"Food/valid/MRR": 0.1, "Kitchen/valid/MRR": float("nan")}, ("Food", "Kitchen")) == 0.1


def test_headline_rivals_are_the_two_strongest_baselines_of_the_recorded_table2():
    """The headline's rivals (spec headline_methods after FedCSR) are the two baselines with the
    best mean test MRR over Food and Kitchen in the recorded 20-round Table 2 (n = 64)."""
    import pandas as pd

    from fedlib.paths import project_root

    table2 = pd.read_csv(project_root() / "results" / "fedcsr" / "table2.csv")
    rows = table2[(table2["dataset"] == "Food-Kitchen") & (table2["metric"] == "MRR") & (table2["dim"] == 64)]
    labels = {X.SPEC.choice("method", m)["paper"]: m for m in X.BASELINES}
    baselines = rows[rows["method"].isin(labels)].groupby("method")["value_ours"].mean()
    assert len(baselines) == len(X.BASELINES) and baselines.notna().all()
    strongest = [labels[m] for m in baselines.sort_values(ascending=False).index[:2]]
    assert X.SPEC.list("headline_methods")[0] == "FedCSR"
    assert sorted(X.SPEC.list("headline_methods")[1:]) == sorted(strongest), baselines.sort_values(ascending=False)


@pytest.mark.parametrize("method", ["FedCSR", "PiNet", "CLSR"])   # the headline's methods
def test_a_longer_round_cap_repeats_the_shorter_runs_rounds_exactly(method):
    """The cut-at-round-20 reading of the headline (tables.headline_cap_effect) needs a run's first
    rounds not to depend on its cap: a 2-round run and a 4-round run of the same cell and seed
    record the same curve for rounds 1-2, to the last digit, and the longer run's curve read up to
    round 2 selects what the 2-round run selected."""
    short = X.run_cell(X.cell("synthetic", method, **{**TINY, "rounds": 2, "patience": 4}))
    long = X.run_cell(X.cell("synthetic", method, **{**TINY, "rounds": 4, "patience": 4}))
    assert long["metrics"]["rounds_run"] == 4
    scores = lambda row: {k: v for k, v in row.items() if "/valid/" in k or "/test/" in k}  # noqa: E731
    assert [scores(row) for row in long["extra"]["curve"][:2]] == [scores(row) for row in short["extra"]["curve"]]
    domains = short["extra"]["domains"]
    capped = X.selected_on_curve(long["extra"]["curve"], domains, cap=2)
    assert capped["round"] == short["metrics"]["selected_round"]
    for domain in domains:
        assert capped[f"{domain}/test/MRR"] == pytest.approx(short["metrics"][f"{domain}/test/MRR"], abs=5e-7)
