"""FedCSR tables from fabricated run records: percent, seed means, labels, sizes, substitutes, needs-download cells."""
import math
import shutil

import numpy as np
import pytest

import fedlib.papers.fedcsr.experiment as X
import fedlib.papers.fedcsr.figures as F
import fedlib.papers.fedcsr.tables as T
from fedlib.paths import project_root
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE, append_run, read_runs
from fedlib.reporting.consistency import check_results_dir

FK = ("Food", "Kitchen")
SCALE = {"MRR": 1.0, "NDCG@5": 1.2, "NDCG@10": 1.5, "HR@1": 0.5, "HR@5": 1.8, "HR@10": 2.0}


@pytest.fixture()
def root(tmp_path, monkeypatch):
    source = project_root() / "paper_tables" / "fedcsr"
    shutil.copytree(source, tmp_path / "paper_tables" / "fedcsr")
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def scores(mrr, seed=0, domains=FK, platforms=False, bytes_per_round=40.0 * 1024 ** 2, full=False):
    """Metrics as run_cell records them: domain i's MRR is mrr + 0.02·seed + 0.01·i (fractions);
    with ``full`` also the full-ranking ``full/<domain>/test/<M>``, a tenth of the sampled value
    plus 0.0007 (so no full-ranking value equals a sampled one)."""
    out = {"selected_round": 4.0 + seed, "test_selected_round": 7.0, "rounds_run": 9.0,
           "bytes_per_round": bytes_per_round, "seconds": 1.0}
    for i, d in enumerate(domains):
        value = mrr + 0.02 * seed + 0.01 * i
        for metric, factor in SCALE.items():
            out[f"{d}/test/{metric}"] = factor * value
            out[f"{d}/valid/{metric}"] = factor * value
            out[f"test_selected/{d}/test/{metric}"] = factor * value + 0.03
            if full:
                out[f"full/{d}/test/{metric}"] = factor * value / 10 + 0.0007
            if platforms:
                for k in range(10):
                    out[f"platform{k}/{d}/test/{metric}"] = factor * value * (k + 1) / 10
    return out


def curve(domains=FK, rounds=3, platforms=10):
    rows = []
    for r in range(1, rounds + 1):
        row = {"round": r, "loss": 1.0 / r, "valid/MRR": 0.01 * r, "test/MRR": 0.01 * r}
        row.update({f"{d}/valid/MRR": 0.01 * r + 0.001 * i for i, d in enumerate(domains)})
        row.update({f"loss/platform{k}": 1.0 for k in range(platforms)})
        rows.append(row)
    return {"curve": rows, "substitute_split": True}


def record(config, values, extra=None):
    append_run("fedcsr", "quick", config, config["seed"], values, 1.0, extra=extra, device="cpu", commit="abc1234")


def row(table, **keys):
    part = table
    for key, value in keys.items():
        part = part[part[key] == value]
    assert len(part) == 1, (keys, len(part))
    return part.iloc[0]


def test_main_tables_percent_seed_means_labels_and_both_fedcsr_sizes(root):
    for seed in (0, 1):
        record(X.cell("Food-Kitchen", "FedCSR", dim=256, seed=seed), scores(0.05, seed), curve())
        record(X.cell("Food-Kitchen", "PiNet", dim=64, seed=seed), scores(0.03, seed))
    record(X.cell("Food-Kitchen", "FedCSR", dim=64), scores(0.04))
    records = read_runs("fedcsr", "quick")
    table = T.main_table("table2_main", records, "quick")

    big = row(table, dataset="Food-Kitchen", domain="Food", method="FedCSR", dim="256", metric="MRR")
    assert big["value_ours"] == pytest.approx(6.0)          # 100 · mean(0.05, 0.07)
    assert big["std_ours"] == pytest.approx(100 * np.std([0.05, 0.07], ddof=1))
    assert big["value_paper"] == pytest.approx(9.15) and big["delta"] == pytest.approx(6.0 - 9.15)
    assert big["n_seeds"] == 2 and big["unit"] == "percent" and big["ours_unit"] == "fraction"
    assert big["repeats_paper_value"] == "False"
    small = row(table, dataset="Food-Kitchen", domain="Kitchen", method="FedCSR", dim="64", metric="HR@5")
    assert small["value_ours"] == pytest.approx(100 * 1.8 * 0.05)
    assert small["value_paper"] == pytest.approx(
        row(table, dataset="Food-Kitchen", domain="Kitchen", method="FedCSR", dim="256", metric="HR@5")["value_paper"])
    assert small["repeats_paper_value"] == "True" and "n=64" in small["note"]
    pinet = row(table, dataset="Food-Kitchen", domain="Food", method="FedPi-Net", metric="MRR")
    assert pinet["dim"] == "64" and pinet["value_ours"] == pytest.approx(4.0) and pinet["value_paper"] == 6.40
    assert "FedProx" in pinet["note"] and "n=64" in pinet["note"]
    ours = table[table["value_ours"].notna()]
    assert len(ours) == 3 * 2 * 3 and ours["note"].str.startswith("SUBSTITUTE split of Food-Kitchen").all()
    assert set(table["metric"]) == {"MRR", "NDCG@5", "HR@5"}  # Table 2's metrics only
    conet = row(table, dataset="Movie-Book", domain="Book", method="FedCoNet", metric="MRR")
    assert math.isnan(conet["value_ours"]) and conet["note"].startswith("not run")
    assert set(table["method"]) == set(T.PAPER_LABELS.values())

    full = T.main_table("table6_food_kitchen_full", records, "quick")
    assert set(full["metric"]) == set(T.METRICS) and set(full["dataset"]) == {"Food-Kitchen"}
    assert row(full, domain="Food", method="FedCSR", dim="256", metric="NDCG@10")["value_ours"] == pytest.approx(
        100 * 1.5 * 0.06)
    ent = T.main_table("table8_entertainment_education_full", records, "quick")
    assert len(ent) == 108 + 12 and ent["value_ours"].isna().all() and ent["value_paper"].notna().all()
    assert ent["note"].str.startswith(NEEDS_DOWNLOAD_NOTE).all()


def test_full_ranking_rows_carry_exactly_the_recorded_values(root):
    for seed in (0, 1):
        record(X.cell("Food-Kitchen", "FedCSR", dim=256, seed=seed), scores(0.05, seed, full=True))
    record(X.cell("Food-Kitchen", "FedCSR", dim=64), scores(0.04))                 # recorded without full ranking
    record(X.cell("Food-Kitchen", "PiNet", dim=64), scores(0.03, full=True))
    records = read_runs("fedcsr", "quick")
    by_id = {r.config_hash: r for r in records}
    table = T.full_ranking_table(records, "quick")

    # every (dataset, method, size, domain, metric) of Tables 6-7, ours only
    assert len(table) == 2 * (2 + len(X.BASELINES)) * 2 * len(T.METRICS)
    assert table["value_paper"].isna().all() and table["delta"].isna().all()
    assert (table["protocol"] == T.FULL_RANKING_PROTOCOL).all()
    assert T.FULL_RANKING_PROTOCOL == "full ranking (ours only; the paper reports 1 + 999 sampled)"
    ours = table[table["value_ours"].notna()]
    assert len(ours) == 2 * 2 * len(T.METRICS)                                      # FedCSR n=256 and FedPi-Net
    for _, r in ours.iterrows():
        assert r["run_metric"] == f"full/{r['domain']}/test/{r['metric']}"
        runs = [by_id[h] for h in r["run_ids"].split(";")]
        assert r["value_ours"] == pytest.approx(100 * np.mean([run.metrics[r["run_metric"]] for run in runs]),
                                                rel=1e-12)
        assert r["unit"] == "percent" and r["note"].startswith("SUBSTITUTE split of Food-Kitchen")
        assert T.FULL_RANKING_PROTOCOL in r["note"]
    big = row(table, domain="Kitchen", method="FedCSR", dim="256", metric="NDCG@10")
    assert big["n_seeds"] == 2 and big["value_ours"] == pytest.approx(100 * (1.5 * 0.07 / 10 + 0.0007))
    sampled = row(T.main_table("table6_food_kitchen_full", records, "quick"), domain="Kitchen", method="FedCSR", dim="256", metric="NDCG@10")
    assert sampled["value_ours"] == pytest.approx(100 * 1.5 * 0.07)              # Table 6 keeps the sampled value
    assert row(table, domain="Food", method="FedPi-Net", metric="HR@5")["value_ours"] == pytest.approx(
        100 * (1.8 * 0.03 / 10 + 0.0007))
    predates = table[(table["method"] == "FedCSR") & (table["dim"] == "64") & (table["dataset"] == "Food-Kitchen")]
    assert len(predates) == 12 and predates["value_ours"].isna().all()
    assert (predates["note"] == T.NO_FULL_RANKING_NOTE).all()
    conet = row(table, dataset="Movie-Book", domain="Book", method="FedCoNet", metric="MRR")
    assert math.isnan(conet["value_ours"]) and conet["note"].startswith("not run")


def test_the_lessons_live_runs_are_recorded_at_quick():
    """The lesson's quick path on the committed quick runs: each live cell has its curve (one point
    per round, for the convergence figure) and its full ranking, which is below the sampled score."""
    from fedlib.notebook.profiles import load_settings

    records = read_runs("fedcsr", "quick")
    if not records:
        pytest.skip("no quick-profile FedCSR runs recorded")
    settings = load_settings("05_fedcsr", "quick")
    cells = [X.cell(settings.dataset, variant=variant, dim=settings.dim, rounds=settings.rounds,
                    patience=settings.rounds, lr=settings.lr, local_epochs=settings.local_epochs,
                    batch_size=settings.batch_size, seed=settings.seed, platforms=settings.platforms or None)
             for variant in settings.live_variants]
    curves = F.curve_frame(records, cells)
    for variant in settings.live_variants:
        rounds = curves[(curves["method"] == variant) & (curves["series"] == "valid/MRR")]["round"]
        assert sorted(rounds) == list(range(1, settings.rounds + 1)), variant
    by_hash = {r.config_hash: r for r in records}
    for config in cells:
        metrics = by_hash[X.config_hash(config)].metrics
        for domain in ("Food", "Kitchen"):
            assert 0 < metrics[f"full/{domain}/test/MRR"] < metrics[f"{domain}/test/MRR"]


def test_ablation_alpha_and_individual_mapping(root):
    for variant in ("w/o SCL & MCL", "w/o MCL", "w/o SCL", "FedCSR"):
        record(X.cell("Food-Kitchen", "FedCSR", variant=variant, dim=64),
               scores({"w/o SCL & MCL": 0.02, "w/o MCL": 0.03, "w/o SCL": 0.035, "FedCSR": 0.04}[variant]))
    for alpha in (0.1, 0.2):
        record(X.cell("Food-Kitchen", "FedCSR", alpha=alpha, dim=64), scores(0.01 + alpha / 10))
    record(X.cell("Food-Kitchen", "Individual", dim=64), scores(0.02, platforms=True))
    record(X.cell("Food-Kitchen", "Centralized", dim=64), scores(0.06))
    records = read_runs("fedcsr", "quick")

    t3 = T.ablation_table("table3_ablation_food_kitchen", records, "quick")
    scl = row(t3, domain="Food", method="SCL only (w/o MCL)", metric="MRR")
    assert scl["setting"] == "SCL=yes, MCL=no" and scl["value_paper"] == 8.48
    assert scl["value_ours"] == pytest.approx(3.0)
    assert row(t3, domain="Food", method="FedCSR (SCL + MCL)", metric="HR@10")["value_ours"] == pytest.approx(8.0)
    mcl = row(t3, domain="Kitchen", method="MCL only (w/o SCL)", metric="MRR")
    assert math.isnan(mcl["value_paper"]) and mcl["value_ours"] == pytest.approx(4.5) and mcl["unit"] == "percent"
    assert "ours only" in mcl["note"] and "SUBSTITUTE" in mcl["note"]
    assert T.ablation_table("table4_ablation_movie_book", records, "quick")["value_ours"].isna().all()  # Movie-Book not run

    t5 = T.table5(records, "quick")
    assert row(t5, domain="Food", setting="alpha=0.1", metric="MRR")["value_ours"] == pytest.approx(2.0)
    extra = row(t5, domain="Food", setting="alpha=0.2", metric="MRR")
    assert math.isnan(extra["value_paper"]) and extra["value_ours"] == pytest.approx(3.0)
    assert row(t5, domain="Food", setting="alpha=0.3", metric="MRR")["value_ours"] == pytest.approx(4.0)  # = FedCSR

    t9 = T.table9(records, "quick")
    p4 = row(t9, domain="Food", method="Individual training", setting="platform 4", metric="MRR")
    assert p4["value_ours"] == pytest.approx(100 * 0.02 * 4 / 10) and p4["value_paper"] == 5.99
    assert p4["run_metric"] == "platform3/Food/test/MRR"
    p10 = row(t9, domain="Kitchen", method="Individual training", setting="platform 10", metric="HR@10")
    assert p10["value_ours"] == pytest.approx(100 * 2 * 0.03)
    fed = row(t9, domain="Food", method="FedCSR", setting="federated (all 10 platforms)", metric="MRR")
    assert fed["value_ours"] == pytest.approx(4.0) and fed["value_paper"] == 9.15
    central = row(t9, domain="Food", method="Centralized training", metric="MRR")
    assert math.isnan(central["value_paper"]) and central["value_ours"] == pytest.approx(6.0)
    assert row(t9, domain="Food", setting=T.TABLE9_ALL_PLATFORMS, metric="MRR")["value_ours"] == pytest.approx(2.0)


def test_table9_sets_fedcsr_beside_each_platform_when_its_run_recorded_them(root):
    """The federated model on each platform's own test rows is a row of its own (paper: none),
    and a third bar per platform in Figure 4; without such records neither appears."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record(X.cell("Food-Kitchen", "Individual", dim=64), scores(0.02, platforms=True))
    record(X.cell("Food-Kitchen", "FedCSR", dim=64), scores(0.04))
    before = T.table9(read_runs("fedcsr", "quick"), "quick")
    assert not ((before["method"] == "FedCSR") & before["setting"].str.startswith("platform ")).any()
    bars_before = len(F.figure_individual(before).axes[0].patches)

    record(X.cell("Food-Kitchen", "FedCSR", dim=64), scores(0.04, platforms=True))  # a rerun that records them
    t9 = T.table9(read_runs("fedcsr", "quick"), "quick")
    fed_p3 = row(t9, domain="Kitchen", method="FedCSR", setting="platform 3", metric="MRR")
    assert fed_p3["value_ours"] == pytest.approx(100 * 0.05 * 3 / 10) and math.isnan(fed_p3["value_paper"])
    assert fed_p3["run_metric"] == "platform2/Kitchen/test/MRR" and "own test rows" in fed_p3["note"]
    alone_p3 = row(t9, domain="Kitchen", method="Individual training", setting="platform 3", metric="MRR")
    assert alone_p3["value_ours"] == pytest.approx(100 * 0.03 * 3 / 10) and alone_p3["value_paper"] == 3.76
    pooled = row(t9, domain="Food", method="FedCSR", setting="federated (all 10 platforms)", metric="MRR")
    assert pooled["value_ours"] == pytest.approx(4.0) and pooled["value_paper"] == 9.15
    fig = F.figure_individual(t9)
    labels = [text.get_text() for text in fig.legends[0].get_texts()]   # one legend below the panels
    assert labels == ["ours", "paper", "FedCSR on this platform (ours)"]
    assert len(fig.axes[0].patches) == bars_before // 2 * 3   # a third bar in every group
    plt.close("all")


def test_write_tables_pass_the_consistency_check(root):
    record(X.cell("Food-Kitchen", "FedCSR", dim=256), scores(0.05, full=True), curve())
    record(X.cell("Food-Kitchen", "FedCSR", dim=64), scores(0.04, bytes_per_round=20.0 * 1024 ** 2), curve())
    for variant in ("w/o unified", "code: all"):
        record(X.cell("Food-Kitchen", "FedCSR", variant=variant, dim=64), scores(0.03))
    record(X.cell("Food-Kitchen", "FedCSR", dim=64, scl_hidden_factor=0.25), scores(0.02))
    record(X.cell("Food-Kitchen", "Individual", dim=64), scores(0.02, platforms=True))
    tables = T.write_tables("quick", datasets=("Food-Kitchen",))
    assert check_results_dir(root / "results" / "fedcsr" / "quick") == []
    written = {p.stem for p in (root / "results" / "fedcsr" / "quick").glob("*.csv")}
    assert written == {"table1", "table2", "table3", "table4", "table5", "table6", "table7", "table8", "table9",
                       "appendixA5", "full_ranking", "figure2", "figure6", "audit", "headline"}
    full = tables["full_ranking"]
    assert full["value_ours"].notna().sum() == 2 * 6  # FedCSR n=256, both domains; n=64 predates the full ranking
    assert (full["value_ours"].isna() == full["note"].isin([T.NO_FULL_RANKING_NOTE])
            | full["note"].str.startswith("not run")).all()

    t1 = tables["table1_dataset_stats"]
    users = row(t1, dataset="Food-Kitchen", metric="#Users", setting="")
    assert users["value_ours"] == 16579 and users["value_paper"] == 16579 and "SUBSTITUTE" in users["note"]
    assert row(t1, dataset="Food-Kitchen", domain="Kitchen", metric="#Items")["value_ours"] == 34886
    sparsity = row(t1, dataset="Food-Kitchen", metric="Sparsity", setting="")
    assert 99.0 < sparsity["value_ours"] < 100.0 and sparsity["unit"] == "percent"
    shares = t1[t1["metric"] == "platform share of training users"]
    assert len(shares) == 10 and shares["value_ours"].sum() == pytest.approx(100.0)
    sequences = t1[t1["metric"] == "platform #Train sequences"]["value_ours"].sum()
    assert sequences == row(t1, dataset="Food-Kitchen", metric="#Train", setting="")["value_ours"]

    comm = tables["appendixA5_comm_cost"]
    rounds = row(comm, dataset="Food-Kitchen", dim="256", metric=T.ROUNDS_METRIC)
    assert rounds["value_ours"] == 4 and rounds["value_paper"] == 25 and rounds["unit"] == "rounds"
    single = row(comm, dataset="Food-Kitchen", dim="64", metric=T.VOLUME_METRIC)
    assert single["value_ours"] == pytest.approx(1.0) and single["unit"] == "MB"  # 20 MB / (2 × 10 platforms)
    hypothetical = comm[comm["dataset"].str.startswith("hypothetical")].iloc[0]
    assert math.isnan(hypothetical["value_ours"]) and "hypothetical" in hypothetical["note"]

    audit = tables["audit"]
    gap = row(audit, method="code: all", domain="Food", metric="HR@10", stat=T.AUDIT_STATS[2])
    assert gap["value_ours"] == pytest.approx(3.0) and gap["run_ids"]  # test-selected + 0.03
    assert row(audit, method="code: all", metric="round", stat="test-selected")["value_ours"] == 7
    # the test-selected side only saw the rounds the validation-stopped run trained: a lower bound, said in the note
    recorded = audit[audit["value_ours"].notna()]
    lower_bound = recorded["note"].str.contains("LOWER BOUND", regex=False)
    assert (lower_bound == (recorded["stat"] != T.AUDIT_STATS[0])).all() and lower_bound.any()
    assert "patience 20, at most 20 rounds" in gap["note"] and "every round" in gap["note"]
    assert audit[audit["method"] == "code: central graph"]["value_ours"].isna().all()
    fig2 = tables["figure2"]
    assert row(fig2, method="w/o unified", domain="Kitchen", metric="MRR")["value_ours"] == pytest.approx(4.0)
    assert fig2[fig2["method"] == "w/o single"]["note"].str.startswith("not run").all()
    fig6 = tables["figure6"]
    assert row(fig6, setting="hidden = 0.25·n", domain="Food", metric="MRR")["value_ours"] == pytest.approx(2.0)
    assert row(fig6, setting="hidden = 2·n", domain="Food", metric="MRR")["value_ours"] == pytest.approx(4.0)


def test_no_runs_and_the_smoke_task(root):
    tables = T.all_tables([], "quick")
    for table_id, frame in tables.items():
        assert len(frame), table_id
        assert frame["value_ours"].isna().all() and (frame["note"].str.len() > 0).all(), table_id
    assert tables["table2_main"]["note"].str.startswith("not run").any()

    # a smoke profile fixes one small size for every cell (as the notebook's live cells do)
    cell_kwargs = {"dim": 8, "rounds": 2, "patience": 2, "local_epochs": 1, "seed": 0}
    method_kwargs = {m: {"rounds": 1} for m in X.BASELINES}
    record(X.method_cell("synthetic", "FedCSR", cell_kwargs, method_kwargs), scores(0.3, domains=("A", "B"),
                                                                                     full=True))
    record(X.method_cell("synthetic", "C2DSR", cell_kwargs, method_kwargs), scores(0.2, domains=("A", "B")))
    record(X.cell("synthetic", "Individual", **cell_kwargs), scores(0.1, domains=("A", "B"), platforms=True))
    records = read_runs("fedcsr", "quick")
    smoke = T.all_tables(records, "quick", cell_kwargs, method_kwargs, datasets=("synthetic",))
    t2 = smoke["table2_main"]
    synthetic = row(t2, dataset="synthetic", domain="B", method="FedC2DSR", metric="MRR")
    assert synthetic["value_ours"] == pytest.approx(21.0) and synthetic["unit"] == "percent"
    assert synthetic["dim"] == "8" and math.isnan(synthetic["value_paper"]) and "synthetic" in synthetic["note"]
    assert row(t2, dataset="synthetic", domain="A", method="FedCSR", metric="MRR")["value_ours"] == pytest.approx(30.0)
    paper_fedcsr = row(t2, dataset="Food-Kitchen", domain="Food", method="FedCSR", metric="MRR")  # one size only
    assert paper_fedcsr["dim"] == "8" and paper_fedcsr["repeats_paper_value"] == "False"
    assert smoke["table6_food_kitchen_full"]["value_ours"].isna().all()
    t9 = smoke["table9_individual_training"]
    platform2 = row(t9, dataset="synthetic", domain="A", method="Individual training", setting="platform 2",
                    metric="MRR")
    assert platform2["value_ours"] == pytest.approx(2.0)  # 100 · 0.1 · 2 / 10
    assert set(smoke["audit"]["dataset"]) == {"synthetic"} and set(smoke["audit"]["domain"]) == {"A", "B", ""}
    full = smoke["full_ranking"]
    assert set(full["dataset"]) == {"synthetic"} and set(full["dim"]) == {"8"}
    assert row(full, domain="B", method="FedCSR", metric="HR@10")["value_ours"] == pytest.approx(
        100 * (2.0 * 0.31 / 10 + 0.0007))
    assert full[full["method"] == "FedC2DSR"]["value_ours"].isna().all()  # recorded without full ranking


def test_figures_build_from_frames(root):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record(X.cell("Food-Kitchen", "FedCSR", dim=64), scores(0.04), curve())
    record(X.cell("Food-Kitchen", "C2DSR", dim=64), scores(0.03), curve(rounds=5))
    record(X.cell("Food-Kitchen", "FedCSR", variant="w/o single", dim=64), scores(0.03))
    record(X.cell("Food-Kitchen", "FedCSR", dim=64, scl_hidden_factor=4.0), scores(0.035))
    record(X.cell("Food-Kitchen", "Individual", dim=64), scores(0.02, platforms=True))
    records = read_runs("fedcsr", "quick")

    curves = F.curve_frame(records, F.figure3_configs())
    food = curves[(curves["series"] == "Food/valid/MRR")]
    assert set(food["method"]) == {"FedCSR", "FedC2DSR"} and food["round"].max() == 5
    fig = F.figure_curves(curves, "figure3_convergence", profile="quick")
    assert fig is not None and (root / "figures" / "fedcsr" / "figure3_convergence.png").exists()
    assert len(fig.axes) == 2  # Food, Kitchen
    assert F.figure_curves(curves.iloc[0:0]) is None
    assert F.figure_prediction_targets(T.figure2_table(records, "quick")) is not None
    assert F.figure_individual(T.table9(records, "quick")) is not None
    assert F.figure_individual(T.table9([], "quick")) is None
    assert F.figure_hidden(T.figure6_table(records, "quick")) is not None
    plt.close("all")


def headline_cell(method, lr, seed=0):
    [config] = [c for c in X.grid_cells("headline_lr") if (c["method"], c["lr"]) == (method, lr)]
    return {**config, "seed": seed}


def test_headline_tuning_chooses_on_validation_and_flags_an_edge(root):
    valid = {("FedCSR", 5e-4): 0.06, ("FedCSR", 1e-3): 0.07, ("FedCSR", 2e-3): 0.08,   # the largest wins: an edge
             ("PiNet", 5e-4): 0.05, ("PiNet", 2e-3): 0.09,                            # 1e-3 not recorded
             ("CLSR", 5e-4): 0.03, ("CLSR", 1e-3): 0.05, ("CLSR", 2e-3): 0.04,        # interior, of its
             ("CLSR", 4e-3): 0.02, ("CLSR", 8e-3): 0.01}                              # twice widened grid
    for (method, lr), mrr in valid.items():
        values = {**scores(mrr), "selected_round": 40.0, "rounds_run": 60.0 if method == "CLSR" else 100.0}
        record(headline_cell(method, lr), values)
    frame = T.headline_tuning(read_runs("fedcsr", "quick"))
    assert len(frame) == 12 and list(frame.columns[:5]) == ["method", "lr", "valid MRR", "Food test MRR",
                                                         "Kitchen test MRR"]
    fedcsr_best = row(frame, method="FedCSR", lr=2e-3)
    assert fedcsr_best["chosen"] and fedcsr_best["edge"]
    assert fedcsr_best["valid MRR"] == pytest.approx(100 * (0.08 + 0.09) / 2)   # the mean of the two domains
    assert fedcsr_best["Kitchen test MRR"] == pytest.approx(9.0) and fedcsr_best["cap"] == 100
    clsr = row(frame, method="FedCLSR", lr=1e-3)
    assert clsr["chosen"] and not clsr["edge"] and clsr["rounds run"] == 60 and clsr["selected round"] == 40
    assert not frame[frame["method"] == "FedPi-Net"]["chosen"].any()             # not all rates recorded yet
    assert list(frame[frame["method"] == "FedPi-Net"]["lr"]) == [5e-4, 1e-3, 2e-3, 4e-3]  # its widened grid, in order
    missing = row(frame, method="FedPi-Net", lr=1e-3)
    assert math.isnan(missing["valid MRR"]) and missing["run_id"] == ""
    assert frame["chosen"].sum() == 2


def test_headline_progress_counts_rates_and_seeds_and_checks_the_spec(root):
    for lr, mrr in ((5e-4, 0.05), (1e-3, 0.07), (2e-3, 0.06)):       # FedCSR: 1e-3 chosen, interior
        record(headline_cell("FedCSR", lr), scores(mrr))
    record(headline_cell("FedCSR", 1e-3, seed=2), scores(0.07, 2))    # a further seed at the spec's rate
    record(headline_cell("FedCSR", 2e-3, seed=1), scores(0.06, 1))    # a seed at another rate: not counted
    for lr, mrr in ((5e-4, 0.05), (1e-3, 0.06), (2e-3, 0.08), (4e-3, 0.09)):   # π-Net: 4e-3, its widened top
        record(headline_cell("PiNet", lr), scores(mrr))
    record(headline_cell("CLSR", 2e-3), scores(0.04))                 # CLSR: one rate of five
    frame = T.headline_progress(read_runs("fedcsr", "quick")).set_index("method")
    assert list(frame.index) == ["FedCSR", "FedPi-Net", "FedCLSR"]
    assert frame.loc["FedCSR", "rates recorded"] == "3 of 3" and frame.loc["FedCSR", "chosen lr"] == 1e-3
    assert not frame.loc["FedCSR", "edge"] and frame.loc["FedCSR", "seeds recorded"] == "2 of 3"
    assert frame.loc["FedCSR", "agrees"] == (X.HEADLINE_LR["FedCSR"] == 1e-3)
    assert frame.loc["FedPi-Net", "rates recorded"] == "4 of 4"
    assert frame.loc["FedPi-Net", "chosen lr"] == 4e-3 and frame.loc["FedPi-Net", "edge"]
    assert frame.loc["FedPi-Net", "agrees"] == (X.HEADLINE_LR["PiNet"] == 4e-3)
    assert frame.loc["FedPi-Net", "seeds recorded"] == "1 of 3"                       # every rate's seed 0 is recorded
    clsr = frame.loc["FedCLSR"]
    assert clsr["rates recorded"] == "1 of 5" and math.isnan(clsr["chosen lr"]) and clsr["agrees"] is None
    assert not clsr["edge"] and clsr["seeds recorded"] == ("1 of 3" if X.HEADLINE_LR["CLSR"] == 2e-3 else "0 of 3")
    assert (frame["headline lr"] == [X.HEADLINE_LR[m] for m in ("FedCSR", "PiNet", "CLSR")]).all()


def test_headline_table_averages_seeds_at_the_chosen_rate_and_verdicts_test_them(root):
    chosen = X.HEADLINE_LR                                   # each method's headline rate (the spec's)
    for seed in (0, 1, 2):
        record(headline_cell("FedCSR", chosen["FedCSR"], seed), scores(0.10, seed))
        record(headline_cell("PiNet", chosen["PiNet"], seed), scores(0.05, seed))
    record(headline_cell("CLSR", chosen["CLSR"], 0), scores(0.04))
    other = next(lr for lr in X.headline_rates("CLSR") if lr != chosen["CLSR"])
    record(headline_cell("CLSR", other, 0), scores(0.30))    # another rate: not a headline row
    records = read_runs("fedcsr", "quick")
    table = T.headline_table(records, "quick")
    assert set(table["lr"]) == {str(lr) for lr in chosen.values()}
    assert set(table["dim"]) == {"64"} and set(table["domain"]) == {"Food", "Kitchen"}
    ours = row(table, domain="Kitchen", method="FedCSR", metric="MRR")
    assert ours["value_ours"] == pytest.approx(100 * (0.11 + 0.13 + 0.15) / 3) and ours["n_seeds"] == 3
    assert ours["std_ours"] == pytest.approx(2.0) and math.isnan(ours["value_paper"])
    assert f"up to 100 rounds (patience 20), lr {chosen['FedCSR']}" in ours["note"]
    clsr = row(table, domain="Food", method="FedCLSR", metric="HR@5")
    assert clsr["value_ours"] == pytest.approx(100 * 1.8 * 0.04) and clsr["n_seeds"] == 1

    verdicts = T.headline_verdicts(table)
    assert list(verdicts["domain"]) == ["Food", "Food", "Kitchen", "Kitchen"]
    assert list(verdicts["rival"]) == ["FedPi-Net", "FedCLSR"] * 2                      # strongest first
    pinet = verdicts[verdicts["rival"] == "FedPi-Net"]
    assert (pinet["verdict"] == "ahead").all() and (pinet["seeds"] == "3 vs 3").all()
    assert (pinet["p"] < 0.05).all()
    assert (verdicts[verdicts["rival"] == "FedCLSR"]["verdict"] == "untested (fewer than two seeds a side)").all()
    food, kitchen = T.headline_sentences(verdicts)
    pinet_food = verdicts[(verdicts["domain"] == "Food") & (verdicts["rival"] == "FedPi-Net")].iloc[0]
    assert food.startswith(f"Food: FedCSR's {100 * (0.10 + 0.12 + 0.14) / 3:.2f} % test MRR is ahead of FedPi-Net "
                           f"({100 * (0.05 + 0.07 + 0.09) / 3:.2f} %, +")
    assert f"p = {pinet_food['p']:.2g}, 3 vs 3 seeds)" in food
    assert food.endswith("and untested against FedCLSR (4.00 %, +200.0 %, 3 vs 1 seeds).")
    assert kitchen.startswith("Kitchen: FedCSR's 13.00 % test MRR")

    # an unrecorded headline cell says how to record it at the paper profile
    empty = T.headline_table([], "paper")
    assert empty["value_ours"].isna().all() and (empty["note"] == T.HEADLINE_MISSING_NOTE).all()
    assert T.headline_verdicts(empty).empty


def test_headline_curves_draw_one_line_per_method_and_rate_with_the_old_cap_marked(root):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record(headline_cell("PiNet", 1e-3), scores(0.05), curve(rounds=30))
    record(headline_cell("PiNet", 2e-3), scores(0.06), curve(rounds=40))
    record(headline_cell("PiNet", 1e-3, seed=1), scores(0.05, 1), curve(rounds=25))
    record(X.cell("Food-Kitchen", "PiNet", dim=64), scores(0.04), curve(rounds=20))  # the 20-round cell: not a line
    frame = F.headline_curve_frame(read_runs("fedcsr", "quick"))
    assert set(frame["method"]) == {"FedPi-Net, lr 0.001", "FedPi-Net, lr 0.002"}
    assert sorted(frame[frame["method"] == "FedPi-Net, lr 0.001"]["seed"].unique()) == [0, 1]
    assert frame[frame["method"] == "FedPi-Net, lr 0.002"]["round"].max() == 40
    fig = F.figure_curves(frame, mark_round=20, mark_label="the tables' 20-round cap")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["FedPi-Net, lr 0.001 (n=64)", "FedPi-Net, lr 0.002 (n=64)", "the tables' 20-round cap"]
    assert any(list(line.get_xdata()) == [20, 20] for line in fig.axes[0].lines)
    mean_rounds = max(line.get_xdata().max() for line in fig.axes[0].lines if line.get_label().startswith("FedPi-Net, lr 0.001"))
    assert mean_rounds == 30                       # the seed mean runs to the longer seed's last round
    # per seed: seed 1 of 1e-3 is its own lighter line (to round 25), the legend unchanged
    fig = F.figure_curves(frame, mark_round=20, mark_label="the tables' 20-round cap", per_seed=True)
    assert fig.axes[0].get_legend_handles_labels()[1] == labels
    curves = [line for line in fig.axes[0].lines if len(line.get_xdata()) > 2]
    assert sorted(int(line.get_xdata().max()) for line in curves) == [25, 30, 40]
    [seed1] = [line for line in curves if line.get_xdata().max() == 25]
    [seed0] = [line for line in curves if line.get_label() == "FedPi-Net, lr 0.001 (n=64)"]
    assert seed1.get_color() == seed0.get_color() and seed1.get_label() == "_nolegend_" and seed1.get_alpha() < 1
    plt.close("all")


def test_headline_runs_lists_every_planned_cell_with_its_stop_and_its_hours(root):
    from fedlib.reporting.results import append_run

    def timed(config, values, hours):
        append_run("fedcsr", "quick", config, config["seed"], values, hours * 3600, device="cpu", commit="abc1234")

    chosen = X.HEADLINE_LR["PiNet"]
    other = next(lr for lr in X.headline_rates("PiNet") if lr != chosen)
    timed(headline_cell("PiNet", chosen), {**scores(0.05), "rounds_run": 74.0, "selected_round": 54.0}, 2.0)
    timed(headline_cell("PiNet", other), {**scores(0.06), "rounds_run": 100.0, "selected_round": 100.0}, 3.0)
    frame = T.headline_runs(read_runs("fedcsr", "quick"))
    planned = T.headline_cells()
    rate_cells = len(X.grid_cells("headline_lr"))
    assert len(frame) == len(planned) == rate_cells + 2 * len(X.grid_cells("headline"))   # seeds 1, 2 are new cells
    assert list(dict.fromkeys(frame["method"])) == ["FedCSR", "FedPi-Net", "FedCLSR"]
    assert frame["recorded"].sum() == 2
    patience = row(frame, method="FedPi-Net", lr=chosen, seed=0)
    assert patience["stopped by"] == "patience" and patience["selected round"] == 54 and patience["hours"] == pytest.approx(2.0)
    assert patience["hours are"] == "recorded"
    assert row(frame, method="FedPi-Net", lr=other, seed=0)["stopped by"] == "cap"
    later = row(frame, method="FedPi-Net", lr=chosen, seed=2)      # priced by the same cell's seed 0
    assert not later["recorded"] and later["hours are"] == "estimated" and later["hours"] == pytest.approx(2.0)
    assert later["stopped by"] == "" and math.isnan(later["rounds run"])
    assert frame[frame["method"] == "FedCSR"]["hours"].isna().all()     # no FedCSR run at all: no guess


def peaked_curve(peaks, rounds, test_at):
    """A recorded curve whose mean validation MRR over Food and Kitchen rises to 0.05 at each
    round of ``peaks`` in turn (ties after the first), and whose test MRR at round r is
    ``test_at(r)`` (fractions; Kitchen's is half of Food's)."""
    rows = []
    for r in range(1, rounds + 1):
        level = 0.01 * sum(r >= p for p in peaks)               # a step up at each peak
        rows.append({"round": r, "Food/valid/MRR": 0.04 + level, "Kitchen/valid/MRR": 0.02 + level,
                     "Food/test/MRR": test_at(r), "Kitchen/test/MRR": test_at(r) / 2})
    return {"curve": rows, "substitute_split": True}


def test_selected_on_curve_picks_the_first_best_validation_up_to_the_cap():
    curve = peaked_curve([3, 15, 40], rounds=60, test_at=lambda r: r / 1000)["curve"]
    assert X.selected_on_curve(curve, FK)["round"] == 40                # the whole run: its last step up
    assert X.selected_on_curve(curve, FK, cap=20)["round"] == 15        # cut at 20: the step before
    assert X.selected_on_curve(curve, FK, cap=2)["round"] == 1          # a flat start: the first round
    nan_rows = [{**row, "Food/valid/MRR": math.nan, "Kitchen/valid/MRR": math.nan} for row in curve[:5]]
    assert X.selected_on_curve(nan_rows, FK, cap=20) is None           # nothing finite to select
    assert X.selected_on_curve([], FK) is None


def test_selected_on_curve_gives_back_every_recorded_headline_runs_own_selection():
    """Read on the recorded runs of results/fedcsr/runs.jsonl, the whole curve selects the round
    training selected, with the test MRR training recorded (to the curve's six decimals): the cap-20
    reading reads what training did."""
    from fedlib.reporting.results import config_hash, latest_records

    known = latest_records(read_runs("fedcsr", "paper"))
    cells = X.unique_cells(X.grid_cells("headline_lr") + T.headline_cells())
    runs = [known[config_hash(c)] for c in cells if config_hash(c) in known]
    assert runs, "no recorded headline run"
    for run in runs:
        row = X.selected_on_curve(run.extra["curve"], FK)
        assert row["round"] == run.metrics["selected_round"], run.config_hash
        for domain in FK:
            assert row[f"{domain}/test/MRR"] == pytest.approx(run.metrics[f"{domain}/test/MRR"], abs=5e-7)  # 6 decimals


def test_headline_cap_effect_reads_each_seed_at_both_caps_and_tests_the_change(root):
    chosen = X.HEADLINE_LR
    peaks = {0: [10, 42], 1: [19, 28], 2: [10]}                        # seed 2 peaks before the cap
    for seed, seed_peaks in peaks.items():
        record(headline_cell("FedCSR", chosen["FedCSR"], seed), scores(0.10, seed),
               peaked_curve(seed_peaks, rounds=max(seed_peaks) + 20, test_at=lambda r, s=seed: 0.09 - 0.0005 * r + 0.001 * s))
    record(headline_cell("PiNet", chosen["PiNet"], 0), scores(0.05),
           peaked_curve([12, 54], rounds=74, test_at=lambda r: 0.05 + 0.0002 * r))
    other = next(lr for lr in X.headline_rates("CLSR") if lr != chosen["CLSR"])
    record(headline_cell("CLSR", other, 0), scores(0.04), peaked_curve([30], rounds=50, test_at=lambda r: 0.04))  # not a headline row
    effect = T.headline_cap_effect(read_runs("fedcsr", "quick"))
    assert list(dict.fromkeys(effect["method"])) == ["FedCSR", "FedPi-Net"]
    fedcsr = effect[(effect["method"] == "FedCSR") & (effect["domain"] == "Food")].set_index("seed")
    assert list(fedcsr["selected at cap"]) == [10, 19, 10] and list(fedcsr["selected"]) == [42, 28, 10]
    assert fedcsr.loc[0, "test MRR at cap"] == pytest.approx(100 * (0.09 - 0.0005 * 10))
    assert fedcsr.loc[0, "change"] == pytest.approx(-100 * 0.0005 * 32)          # 32 rounds later, 0.05 points a round
    assert fedcsr.loc[2, "change"] == 0
    kitchen = effect[(effect["method"] == "FedCSR") & (effect["domain"] == "Kitchen")].set_index("seed")
    assert kitchen.loc[1, "change"] == pytest.approx(fedcsr.loc[1, "change"] / 2)

    verdicts = T.headline_cap_verdicts(effect).set_index(["method", "domain"])
    food = verdicts.loc[("FedCSR", "Food")]
    assert food["seeds"] == 3 and food["mean change"] == pytest.approx(fedcsr["change"].mean())
    import scipy.stats
    assert food["p"] == pytest.approx(scipy.stats.ttest_rel(fedcsr["test MRR"], fedcsr["test MRR at cap"]).pvalue)
    assert food["verdict"] == ("lost" if food["p"] < 0.05 else "within seed noise")
    assert verdicts.loc[("FedPi-Net", "Food"), "verdict"] == "untested (fewer than two seeds)"
    assert verdicts.loc[("FedPi-Net", "Kitchen"), "mean change"] == pytest.approx(100 * 0.0002 * 42 / 2)

    # the same selection at every seed is "unchanged", with no p-value
    same = effect.assign(**{"test MRR": effect["test MRR at cap"], "change": 0.0})
    assert (T.headline_cap_verdicts(same).query("method == 'FedCSR'")["verdict"] == "unchanged").all()
    # a change of the same sign and size at every seed beyond noise is a gain
    steady = effect[effect["method"] == "FedCSR"].assign(change=lambda f: 0.5 + 0.01 * f["seed"])
    assert (T.headline_cap_verdicts(steady)["verdict"] == "gained").all()


def test_headline_seeds_lists_the_table2_run_and_every_recorded_headline_seed(root):
    chosen = X.HEADLINE_LR
    record(X.cell("Food-Kitchen", "PiNet", dim=64), {**scores(0.04), "selected_round": 12.0, "rounds_run": 20.0})
    for seed in (0, 2):                                          # seed 1 not recorded: left out
        record(headline_cell("PiNet", chosen["PiNet"], seed), {**scores(0.05, seed), "selected_round": 50.0 + seed})
    record(headline_cell("FedCSR", chosen["FedCSR"], 1), scores(0.10, 1))
    frame = T.headline_seeds(read_runs("fedcsr", "quick"))
    assert list(zip(frame["method"], frame["budget"], frame["seed"])) == [
        ("FedCSR", T.HEADLINE_BUDGET, 1),
        ("FedPi-Net", T.TABLE2_BUDGET, 0), ("FedPi-Net", T.HEADLINE_BUDGET, 0), ("FedPi-Net", T.HEADLINE_BUDGET, 2)]
    pinet = frame[frame["method"] == "FedPi-Net"].set_index(["budget", "seed"])
    assert pinet.loc[(T.TABLE2_BUDGET, 0), "lr"] == 1e-3 and pinet.loc[(T.HEADLINE_BUDGET, 2), "lr"] == chosen["PiNet"]
    assert pinet.loc[(T.TABLE2_BUDGET, 0), "rounds run"] == 20 and pinet.loc[(T.HEADLINE_BUDGET, 2), "selected round"] == 52
    assert pinet.loc[(T.HEADLINE_BUDGET, 2), "Kitchen test MRR"] == pytest.approx(100 * (0.05 + 0.04 + 0.01))
    assert pinet.loc[(T.HEADLINE_BUDGET, 0), "valid MRR"] == pytest.approx(100 * X.headline_validation(scores(0.05), FK))
    assert list(T.headline_seeds([]).columns) == list(frame.columns) and T.headline_seeds([]).empty
