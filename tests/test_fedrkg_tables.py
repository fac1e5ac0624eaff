"""FedRKG tables from (fabricated, in-memory) run records: matching, units, derived cells."""
import numpy as np
import pandas as pd
import pytest

import fedlib.papers.fedrkg.experiment as X
import fedlib.papers.fedrkg.tables as T
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE
from fedlib.reporting.results import RunRecord, config_hash

KW = {"rounds": 50, "eval_every": 10}


def record(config, metrics, extra=None, seed=0):
    config = {**config, "seed": seed}
    return RunRecord(config_hash=config_hash(config), paper="fedrkg", profile="quick", seed=seed, config=config,
                     metrics=metrics, wall_time_s=1.0, commit="abc", device="cpu", fedlib_version="0",
                     torch_version="0", python_version="3", timestamp="now", extra=extra or {})


def scores(value):
    return {"NDCG@5": value, "Recall@5": value + 0.01, "NDCG@10": value + 0.02, "Recall@10": value + 0.03,
            "best_round": 10}


def test_table1_puts_both_samplers_next_to_the_same_paper_value_and_derives_improv():
    values = {"FedMF": 0.10, "PFedRec": 0.20, "FedRAP": 0.30, "FedRKG": 0.45}
    # Table 1 reads the cells at the rates validation chose ([selected]; tuned=True): FedRKG's differs
    assert X.cell("FilmTrust", "FedRKG", sampler="correct", tuned=True, **KW) != X.cell("FilmTrust", "FedRKG",
                                                                                       sampler="correct", **KW)
    records = [record(X.cell("FilmTrust", m, sampler=s, tuned=True, **KW), scores(v + (0.5 if s == "leaky" else 0.0)))
               for m, v in values.items() for s in ("leaky", "correct")]
    table = T.paper_table("table1_main", records, "quick", cell_kwargs=KW)
    row = table[(table.dataset == "FilmTrust") & (table.method == "FedMF") & (table.metric == "N@5")
                & (table.stat == "score")].set_index("sampler")
    assert row.loc["leaky", "value_paper"] == row.loc["correct", "value_paper"] == pytest.approx(19.28)
    assert row.loc["correct", "value_ours"] == pytest.approx(10.0)  # fraction → the paper's percent
    assert row.loc["leaky", "value_ours"] == pytest.approx(60.0)
    improv = table[(table.dataset == "FilmTrust") & (table.metric == "N@5") & (table.stat.str.startswith("Improv"))
                   ].set_index("sampler")
    assert improv.loc["correct", "value_ours"] == pytest.approx(100 * (0.45 / 0.30 - 1))
    assert "FedRAP" in improv.loc["correct", "note"]
    ml1m = table[table.dataset == "ML-1M"]
    assert ml1m["value_ours"].isna().all() and (ml1m["note"] == NEEDS_DOWNLOAD_NOTE).all()
    lastfm = table[table.dataset == "LastFM-2K"]
    assert lastfm["value_ours"].isna().all() and (lastfm["note"] == "not run at this profile").all()


def test_improv_counts_fedrkg_seeds_and_names_the_baselines_it_chose_from():
    # FedRKG over 3 seeds, FedRAP (the best baseline) over 2, FedMF and PFedRec over 1
    values = {"FedMF": [0.10], "PFedRec": [0.20], "FedRAP": [0.30, 0.34], "FedRKG": [0.40, 0.44, 0.48]}
    records = [record(X.cell("FilmTrust", m, sampler="correct", tuned=True, **KW), scores(v), seed=seed)
               for m, seeds in values.items() for seed, v in enumerate(seeds)]
    table = T.paper_table("table1_main", records, "quick", cell_kwargs=KW, samplers=("correct",))
    improv = table[(table.dataset == "FilmTrust") & (table.metric == "N@5")
                   & table.stat.str.startswith("Improv")].iloc[0]
    assert improv["value_ours"] == pytest.approx(100 * (0.44 / 0.32 - 1))
    assert improv["n_seeds"] == 3
    fedrkg_ids = [r.config_hash for r in records if r.config["method"] == "FedRKG"]
    fedrap_ids = [r.config_hash for r in records if r.config["method"] == "FedRAP"]
    assert improv["run_ids"].split(";") == fedrkg_ids
    assert "best of 3 recorded baselines: FedMF, PFedRec, FedRAP → FedRAP" in improv["note"]
    assert "runs " + ";".join(fedrap_ids) in improv["note"]
    # without the strongest baseline the note (and the best) change with what is recorded
    fewer = [r for r in records if r.config["method"] != "FedRAP"]
    improv = T.paper_table("table1_main", fewer, "quick", cell_kwargs=KW, samplers=("correct",))
    improv = improv[(improv.dataset == "FilmTrust") & (improv.metric == "N@5")
                    & improv.stat.str.startswith("Improv")].iloc[0]
    assert "best of 2 recorded baselines: FedMF, PFedRec → PFedRec" in improv["note"]
    assert improv["n_seeds"] == 3


def test_ablation_table_maps_modes_to_the_paper_labels():
    records = [record(X.cell("Amazon-Video", "FedRKG", guidance=mode, sampler="correct", **KW), scores(0.01 * i))
               for i, mode in enumerate(X.GUIDANCE_MODES)]
    table = T.paper_table("tableD1_full_ablation", records, "quick", cell_kwargs=KW, samplers=("correct",))
    got = table[(table.metric == "N@5") & (table.dataset == "Amazon-Video")].set_index("method")["value_ours"]
    assert got.to_dict() == pytest.approx({"FedRKG": 0.0, "w/o AG": 1.0, "w/ GIE": 2.0, "w/ PIE": 3.0})


def test_table5_notes_the_epsilon_of_each_private_run():
    records = [record(X.cell("FilmTrust", "FedRKG", sampler="correct", ldp=X.LDP, **KW),
                      {**scores(0.2), "ldp_epsilon": 1.5e6}),
               record(X.cell("FilmTrust", "FedRKG", sampler="correct", **KW), scores(0.25))]
    table = T.paper_table("tableD2_ldp_filmtrust", records, "quick", cell_kwargs=KW, samplers=("correct",))
    dp = table[(table.method == "FedRKG") & (table.setting == "w/ DP") & (table.metric == "N@5")].iloc[0]
    assert dp["value_ours"] == pytest.approx(20.0) and "ε = 1.5e+06" in dp["note"]
    plain = table[(table.method == "FedRKG") & (table.setting == "w/o DP") & (table.metric == "N@5")].iloc[0]
    assert plain["value_ours"] == pytest.approx(25.0)


def test_gate_change_is_relative_to_the_first_group():
    gates = {"value_all": [0.5, 0.5, 0.6, 0.7], "logit_all": [0.1, 0.3, 0.2, 0.6]}
    change = T._gate_change(gates, np.array([0, 1]), np.array([2, 3]), "all")
    assert change["gating value"] == pytest.approx(100 * (0.65 - 0.5) / 0.5)
    assert change["gating logit"] == pytest.approx(100 * (0.4 - 0.2) / 0.2)


def test_curve_frame_has_one_row_per_evaluation():
    config = X.cell("FilmTrust", "FedRKG", guidance="fixed", **KW)
    frame = T.curve_frame([{"config": config, "extra": {"curve": [{"round": 10, "test/Recall@10": 0.1},
                                                                  {"round": 20, "test/Recall@10": 0.2}]}}])
    assert frame["round"].tolist() == [10, 20] and frame["method"].unique().tolist() == ["w/o AG"]


def test_strength_frame_lists_every_sweep_cell_with_references_and_seed_means():
    cells = X.part_cells("strength", **KW)
    assert len(cells) == 2 * len(X.SPEC.list("guidance_strengths")) + 1
    records = [record(cells[0], scores(0.10), seed=0), record(cells[0], scores(0.20), seed=1),
               record(X.cell("FilmTrust", "FedMF", sampler="correct", **KW), scores(0.30))]
    frame = T.strength_frame(records, KW)
    assert len(frame) == len(cells) + 2
    fedmf = frame[frame.setting.str.startswith("FedMF")].iloc[0]
    assert fedmf["R@10"] == pytest.approx(33.0) and fedmf["seeds"] == 1
    first = frame[frame.setting == "FedRKG β 0.9 T_int 10"].iloc[0]
    assert first["R@10"] == pytest.approx(100 * np.mean([0.13, 0.23])) and first["seeds"] == 2
    assert frame[frame.setting.str.startswith("Full Replacement")]["R@10"].isna().all()  # not recorded


def test_a_diverged_run_is_flagged_in_its_table_cell():
    config = X.cell("FilmTrust", "FedDAE", sampler="correct", tuned=True, **KW)  # Table 1's FedDAE: the chosen server rate
    records = [record(config, scores(0.03), extra={"diverged_at_round": 11}),
               record(X.cell("FilmTrust", "FedMF", sampler="correct", **KW), scores(0.3))]
    table = T.paper_table("table1_main", records, "quick", cell_kwargs=KW, samplers=("correct",))
    dae = table[(table.method == "FedDAE") & (table.dataset == "FilmTrust") & (table.stat == "score")]
    assert dae["note"].str.contains("diverged \\(NaN\\) at round 11").all()
    fedmf = table[(table.method == "FedMF") & (table.dataset == "FilmTrust") & (table.stat == "score")]
    assert not fedmf["note"].fillna("").str.contains("diverged").any()


def test_ldp_accounting_states_the_mapping_and_epsilon_at_one_over_users():
    split = X.load_split("synthetic")
    private = X.part_cells("ldp", dataset="synthetic", sampler="correct", rounds=4)
    table = T.ldp_accounting(private + [X.cell("synthetic", "FedMF", rounds=4)], split)  # the plain cell is skipped
    assert table["method"].tolist() == X.SPEC.list("ldp_methods")
    assert (table["clip C"] == 0.1).all() and (table["noise std s"] == 0.001).all()
    assert table["multiplier s/C"].tolist() == pytest.approx([0.01] * len(private))
    assert table["δ"].tolist() == pytest.approx([1 / split.num_users] * len(private))
    assert table["ε"].tolist() == pytest.approx([X.ldp_epsilon(c, split) for c in private])
    assert table["ε"].gt(1e3).all()  # multiplier 0.01: vacuous
    noised = table.set_index("method")["noised tables"]
    assert noised["FedRKG"] == "personal_item_emb" and noised["FedRAP"] == "personal_item_emb, item_emb"
    # more noise, smaller ε: the mapping is used, not a constant
    louder = X.cell("synthetic", "FedRKG", rounds=4, ldp={"clip": 0.1, "noise_std": 0.5})
    assert T.ldp_accounting([louder], split)["ε"].iloc[0] < table.set_index("method").loc["FedRKG", "ε"]


def test_recorded_ldp_accounting_reads_what_each_run_recorded():
    private = X.cell("FilmTrust", "FedRKG", sampler="correct", ldp=X.LDP, **KW)
    records = [record(private, {**scores(0.2), "ldp_epsilon": 2.5e7, "ldp_delta": 0.001}, seed=1),
               record(private, {**scores(0.2), "ldp_epsilon": 2.5e7, "ldp_delta": 0.001}, seed=0),
               record(X.cell("FilmTrust", "FedRKG", sampler="correct", **KW), scores(0.25))]
    table = T.recorded_ldp_accounting(records)
    assert table["seed"].tolist() == [0, 1] and table["ε"].tolist() == [2.5e7, 2.5e7]
    assert table["δ"].tolist() == [0.001, 0.001] and table["multiplier s/C"].tolist() == pytest.approx([0.01, 0.01])
    assert table["run_id"].tolist() == [records[1].config_hash, records[0].config_hash]
    assert T.recorded_ldp_accounting([]).empty
    # the same cell recorded at an older version too: listed once, at its latest version
    older = record({**private, "version": private["version"] - 1}, {**scores(0.1), "ldp_epsilon": 9.0,
                                                                    "ldp_delta": 0.001}, seed=0)
    again = T.recorded_ldp_accounting([older, *records])
    assert again["run_id"].tolist() == table["run_id"].tolist() and again["ε"].tolist() == [2.5e7, 2.5e7]


def test_claims_test_the_decisive_gap_with_welch_and_say_so():
    # FedRKG (3 seeds) just above FedRAP (3 seeds): holds, but within the seed noise;
    # FedMF far below (1 seed); the leaky sampler has one seed each: no test
    correct = {"FedMF": [0.10], "FedRAP": [0.30, 0.36, 0.33], "FedRKG": [0.34, 0.31, 0.37]}
    records = [record(X.cell("FilmTrust", m, sampler="correct", tuned=True, **KW), scores(v), seed=seed)
               for m, seeds in correct.items() for seed, v in enumerate(seeds)]
    records += [record(X.cell("FilmTrust", m, sampler="leaky", tuned=True, **KW), scores(v))
                for m, v in {"FedMF": 0.40, "FedRKG": 0.97}.items()]
    tables = {"table1_main": T.paper_table("table1_main", records, "quick", cell_kwargs=KW)}
    frame = T.claims(tables)
    assert list(frame.columns) == T.CLAIM_COLUMNS
    beats = frame[frame.claim.str.startswith("FedRKG beats")].set_index("sampler")
    assert beats.loc["correct", "holds"] is True or beats.loc["correct", "holds"] == True  # noqa: E712
    ours, rival = np.array([34.0, 31.0, 37.0]) + 3, np.array([30.0, 36.0, 33.0]) + 3     # R@10 = value + 0.03
    import scipy.stats
    assert beats.loc["correct", "p_welch"] == pytest.approx(
        scipy.stats.ttest_ind(ours, rival, equal_var=False).pvalue, rel=1e-6)
    assert beats.loc["correct", "seeds"] == "3 vs 3"
    assert beats.loc["correct", "verdict"].startswith("holds, within seed noise (p = ")
    assert "FedRAP" in beats.loc["correct", "evidence"]                       # the closest rival, not FedMF
    assert np.isnan(beats.loc["leaky", "p_welch"]) and beats.loc["leaky", "seeds"] == "1 vs 1"
    assert beats.loc["leaky", "verdict"] == "holds, untested (fewer than two seeds a side)"
    reproduction = frame[frame.claim.str.startswith("reproduction")].set_index("sampler")
    assert reproduction.loc["leaky", "verdict"] in ("holds", "fails")         # no test named
    # a lower FedRKG fails the claim
    worse = [r if r.config["method"] != "FedRKG" else record(r.config, scores(0.05), seed=r.seed) for r in records]
    frame = T.claims({"table1_main": T.paper_table("table1_main", worse, "quick", cell_kwargs=KW)})
    assert not frame[frame.claim.str.startswith("FedRKG beats")]["holds"].any()


def test_claims_of_table3_and_table5_compare_the_right_rows():
    base = [record(X.cell("FilmTrust", "FedMF", sampler="correct", **KW), scores(v), seed=s)
            for s, v in enumerate([0.30, 0.31])]
    guided = [record(X.cell("FilmTrust", "FedRKG", backbone="FedMF", sampler="correct", **KW), scores(v), seed=s)
              for s, v in enumerate([0.01, 0.02])]
    tables = {"table3_model_agnostic": T.paper_table("table3_model_agnostic", base + guided, "quick", cell_kwargs=KW, samplers=("correct",))}
    row = T.claims(tables).set_index("claim").loc["Adaptive Guidance improves FedMF (Table 3)"]
    assert row["holds"] == False and row["verdict"].startswith("fails, beyond seed noise")  # noqa: E712
    assert "base 33.50 → w/ AG 4.50" == row["evidence"]
    # Table 5: w/ DP keeps >= 90 % of w/o DP (FedMF: 28 of 30 holds; FedRKG: 20 of 25 fails)
    ldp = [record(X.cell("FilmTrust", m, sampler="correct", ldp=X.LDP, **KW), scores(v))
           for m, v in {"FedMF": 0.28 - 0.03, "FedRKG": 0.20 - 0.03}.items()]
    ldp += [record(X.cell("FilmTrust", m, sampler="correct", **KW), scores(v))
            for m, v in {"FedMF": 0.30 - 0.03, "FedRKG": 0.25 - 0.03}.items()]
    tables = {"table5_ldp_filmtrust": T.paper_table("table5_ldp_filmtrust", ldp, "quick", cell_kwargs=KW, samplers=("correct",))}
    rows = T.claims(tables).set_index("claim")
    fedmf = rows.loc["LDP costs FedMF little accuracy, >= 90 % kept (Table 5)"]
    assert fedmf["holds"] == True and fedmf["evidence"] == "w/o DP 30.00 → w/ DP 28.00"  # noqa: E712
    assert fedmf["verdict"] == "holds, untested (fewer than two seeds a side)"
    assert rows.loc["LDP costs FedRKG little accuracy, >= 90 % kept (Table 5)", "holds"] == False  # noqa: E712
    assert T.claims({}).empty and list(T.claims({}).columns) == T.CLAIM_COLUMNS


def test_fedrap_search_names_what_each_setting_changes_and_reads_its_run():
    reference = X.fedrap_code_cells(["Amazon-Video"], ["leaky"], ["optimizer"])[0]
    searched = X.grid_cells("fedrap_search")
    mu_only = next(c for c in searched if c["params"]["mu"] != reference["params"]["mu"]
                   and c["params"]["lr"] == reference["params"]["lr"])
    curve = [{"round": 10, "train_loss": -3.0}, {"round": 20, "train_loss": -7.5}]
    frame = T.fedrap_search([record(mu_only, {**scores(0.2), "valid/Recall@10": 0.25, "rounds_run": 20},
                                    {"curve": curve}, seed=mu_only["seed"])])
    assert list(frame["setting"])[0] == "the code's defaults"
    assert list(frame["changed"]) == [0, 4, 1, 1, 1, 1]
    assert frame["setting"].iloc[1] == "μ 0.001, weight decay 1e-06, lr 0.0001, item lr 1000"
    row = frame[frame["setting"] == "μ 0.001"].iloc[0]
    assert row["R@10"] == pytest.approx(23.0) and row["valid R@10"] == pytest.approx(25.0)
    assert row["last training loss"] == -7.5 and row["rounds run"] == 20 and row["diverged at round"] == "—"
    assert frame.drop(index=row.name)["R@10"].isna().all(), "settings without a run stay empty"
