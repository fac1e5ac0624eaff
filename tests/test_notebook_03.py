"""Lesson 03 (FedKDRec) and its appendix: recorded metrics at the smoke profile, each exercise's
parameter change at smoke size, and every number the prose quotes, read from the records."""
import math
import re

import pandas as pd
import pytest

from fedlib.papers.fedkdrec import experiment as X
from fedlib.papers.fedkdrec import lesson
from fedlib.notebook.records import record_frame as frame
from fedlib.paths import project_root
from fedlib.reporting import read_runs

STEM = "03_fedkdrec"
ROOT = project_root()


def test_smoke_run_finished(records):
    # wall time is reported by ./run test, never asserted (shared, noisy machines)
    assert records["profile"] == "smoke"
    assert records["__finished__"] is True


def test_equation_checks(records):
    assert records["eq3_gap"] < 1e-6
    upload = records["toy_upload"]
    # ⌊0.34 × positives⌋ positives swap with as many negatives; every other label is mixed (Eq. 4)
    assert upload["swapped"] == 2 * math.floor(0.34 * upload["positives"])
    assert upload["mixed_ok"] is True
    c1 = records["appendix_c1"]
    assert c1["loss_gap"] < 1e-5 and c1["grad_gap"] < 1e-6
    teacher = records["toy_teacher"]
    assert teacher["sum"] == pytest.approx(1.0, abs=1e-5)
    assert teacher["argmax"] == 0  # the lowest-variance client is rewarded most
    td = records["toy_td"]
    # the hand computation in the markdown cell: shaped (0.875, 0.75), δ = (0.555, 0.55)
    assert td["shaped"] == pytest.approx([0.875, 0.75])
    assert td["critic"] == pytest.approx((0.555 ** 2 + 0.55 ** 2) / 2, abs=1e-5)
    assert td["actor"] == pytest.approx(-(math.log(0.6) * 0.555 + math.log(0.7) * 0.55) / 2, abs=1e-5)


def test_live_run_shows_the_teacher_weights(records):
    rounds = frame(records["live_rounds"])
    assert len(rounds) >= 2 and rounds["round"].tolist() == list(range(1, len(rounds) + 1))
    # ω sums to one: the largest ω·C is at least 1, the smallest at most 1, e^H at most C
    assert (rounds["largest ω·C"] >= 1 - 1e-6).all() and (rounds["smallest ω·C"] <= 1 + 1e-6).all()
    assert (rounds["effective teachers"] <= rounds["clients"] + 1e-6).all()
    assert (rounds["largest ω·C"] > 1.01).any(), "the agent's weights should depart from uniform"
    assert rounds["items sent / client"].iloc[0] == 0 and rounds["items sent / client"].iloc[1:].gt(0).all()
    live = records["live"]
    for key in ("sampled H@10", "sampled N@10", "full R@10", "full N@10"):
        assert 0 <= live[key] <= 1, key
    assert live["sampled N@10"] <= live["sampled H@10"] + 1e-9
    assert 0 < live["received B/client/round"] <= 30 * 8


def test_audit_and_deviations(records):
    audit = records["protocol_audit"]
    assert 0 <= audit["central_full"] <= 1 and 0 <= audit["central_sampled"] <= 1
    deviations = records["deviations"]
    assert deviations["cells"] > 0 and deviations["reasons"] >= 3


def test_exercise_records(records):
    live = records["live"]
    assert records["exercise_uniform"]["largest ω·C"] == pytest.approx(1.0)
    assert records["exercise_mu"]["received B/client/round"] <= 5 * 8
    assert records["exercise_alpha"]["labels revealed"] != live["labels revealed"]
    hits = records["exercise_candidates"]
    assert set(hits) >= {"1 + 99", "full ranking"} and len(hits) == 3


# ---------------------------------------------------------------------------------------------
# Each exercise's parameter change at smoke size, through the function the exercise calls
# ---------------------------------------------------------------------------------------------
def _live(**change):
    run = lesson.LiveRun("synthetic", rounds=3, eval_every=3, seed=0, device="cpu", **change)
    run.train("test")
    return run


@pytest.fixture(scope="module")
def default_run():
    return _live()


def test_exercise_1_uniform_teacher_weights(default_run):
    uniform = _live(variant="-c").summary()
    assert uniform["largest ω·C"] == pytest.approx(1.0) and uniform["effective teachers / C"] == pytest.approx(1.0)
    assert default_run.summary()["largest ω·C"] > 1.01


def test_exercise_2_raw_predictions_reveal_fewer_labels(default_run):
    raw = _live(alpha=0.0).summary()
    assert raw["labels revealed"] < default_run.summary()["labels revealed"]


def test_exercise_3_smaller_actor_budget(default_run):
    small = _live(mu=5).summary()
    assert small["received B/client/round"] <= 5 * 8 < default_run.summary()["received B/client/round"]


def test_exercise_4_more_candidates_lower_the_hit_rate(default_run):
    scorer = default_run.scorer
    hits = {n: lesson.sampled_metrics(scorer, default_run.split, num_negatives=n)["HR@10"] for n in (99, 149)}
    random_hits = {n: lesson.sampled_metrics(lesson.random_scorer(default_run.split.num_items), default_run.split,
                                             num_negatives=n)["HR@10"] for n in (49, 149)}
    assert hits[99] != hits[149]
    assert random_hits[149] < random_hits[49]                # 10 of 50 vs 10 of 150 candidates


def test_live_run_equals_the_grid_cell():
    """LiveRun trains the same model as run_cell of the same grid cell (same numbers)."""
    from fedlib.papers.fedkdrec import experiment as experiments

    run = _live()
    cell = experiments.cell("synthetic", "FedKDRec", backbone="NeuMF", rounds=3, eval_every=3, seed=0)
    assert run.cell == cell
    metrics = experiments.run_cell(cell, device="cpu")["metrics"]
    ours = run.metrics()
    for key in ("sampled/HR@10", "sampled/NDCG@10", "full/Recall@10", "full/NDCG@10", "best_round"):
        assert ours[key] == pytest.approx(metrics[key], abs=1e-6), key


# ---------------------------------------------------------------------------------------------
# Numbers quoted in the prose, read from the recorded tables
# ---------------------------------------------------------------------------------------------
def _cell_text(notebook: str, heading: str) -> str:
    text = (ROOT / "notebooks" / f"{notebook}.py").read_text()
    found = [cell for cell in text.split("# %%") if heading in cell]
    assert len(found) == 1, heading
    return re.sub(r"\n#\s?", " ", found[0])


def _central(protocol: str, backbone: str = "NeuMF", metric: str = "H@10") -> pd.Series:
    table = lesson.recorded_table("table1", protocol=protocol)
    row = table[(table.method == "Centralized") & (table.backbone == backbone) & (table.metric == metric)
                & (table.dataset == "MovieLens-100K")]
    assert len(row) == 1
    return row.iloc[0]


def test_audit_paragraph_quotes_the_recorded_scale():
    prose = _cell_text(STEM, "**In plain words.**")
    sampled, full = _central("sampled 1+99"), _central("full ranking")
    assert f"{sampled.value_paper:.1f} %" in prose                       # "The paper's 63.5 %"
    assert "about a fifth of it" in prose and 0.15 < full.value_ours / sampled.value_ours < 0.25
    assert "one user in eight" in prose and 1 / 9 < full.value_ours / 100 < 1 / 7
    assert "within a few points" in prose and abs(sampled.value_ours - sampled.value_paper) < 5
    from fedlib.papers.fedkdrec import experiment as experiments
    split = experiments.load_split("ML-100K")
    # full ranking: every item except the user's training and validation items
    competitors = split.num_items - 1 - split.train.counts()[split.test.users] - 1
    assert "about 1,600 others" in prose and 1500 < competitors.mean() < 1700
    intro = _cell_text(STEM, "## 5. The audit")
    assert f"H@10 = {sampled.value_paper:.1f} %" in intro
    takeaway = _cell_text(STEM, "## 6. Takeaways")
    ratios = [_central("sampled 1+99", b).value_ours / _central("full ranking", b).value_ours
              for b in ("NeuMF", "NeuNCF", "LightGCN")]
    assert "about five times lower" in takeaway and all(4.5 < r < 6 for r in ratios)


def test_deviation_reasons_quote_the_recorded_bytes():
    table3 = lesson.recorded_table("table3", stat=None)
    ptf = table3[(table3.method == "PTF-FedRec") & (table3.dataset == "MovieLens-100K")].iloc[0]
    reasons = dict((str(rule), text) for rule, text in lesson.DEVIATION_REASONS)
    text = next(t for r, t in reasons.items() if "PTF-FedRec" in r)
    assert "about 590" in text and round(ptf.value_paper * 1024 / 8, -1) == 590
    assert "at most 30 predictions of 8 B" in text and ptf.value_ours * 1024 <= 30 * 8


def test_front_matter_time_of_the_recorded_grid():
    from fedlib.reporting import read_runs

    front = _cell_text(STEM, "**Time.**")
    assert "more than a day of single-thread CPU time" in front
    assert sum(r.wall_time_s for r in read_runs("fedkdrec", "paper")) > 24 * 3600


# ---------------------------------------------------------------------------------------------
# The appendix at smoke
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def appendix(smoke_records):
    return smoke_records("03_fedkdrec_appendix")


def test_appendix_claims_read_the_recorded_tables(appendix):
    assert appendix["__finished__"] is True
    verdict = appendix["claims_verdict"]
    assert len(verdict) == 4 * 3                                  # four claims × three backbones
    assert all(text.split(",")[0] in ("holds", "fails", "undecided") for text in verdict.values())
    assert any("seed noise (p = " in text for text in verdict.values())
    claims = frame(appendix["sensitivity_claims"])
    assert {"α = 0.5 is the best α", "β ∈ [0.3, 0.7] is the best range"} <= set(claims["claim"])
    assert claims["p"].between(0, 1).all()


def test_appendix_executors_agree(appendix):
    check = appendix["executor_check"]
    # float32 rounding only: clients ~1e-5; the server's Adam amplifies it a little (see the appendix)
    assert check["client_gap"] < 1e-4 and check["server_gap"] < 2e-3


def test_appendix_label_leak(appendix):
    revealed = appendix["label_revealed"]
    fedkdrec = [v for k, v in revealed.items() if "FedKDRec" in str(k)]
    # α = 0.5: every unswapped private label is revealed by the threshold 0.5
    assert fedkdrec and all(v > 0.9 for v in fedkdrec)
    assert appendix["selected_lr_matches_records"] is True


def test_tables_paragraph_follows_the_recorded_seed_tests():
    """§4's summary of Tables 1-2, checked with the same Welch tests the appendix prints."""
    from fedlib.papers.fedkdrec import tables
    from fedlib.reporting import recorded_or_none

    prose = _cell_text(STEM, "**What the tables say.**")
    recorded = {name: recorded_or_none("fedkdrec", name) for name in ("table1", "table2", "table3", "table4")}
    verdict = tables.claims_verdict(tables.claims(recorded))
    assert "FedKDRec beats PTF-FedRec on every backbone" in prose
    assert all(text.startswith("holds") for text in verdict.loc["FedKDRec beats PTF-FedRec"])
    effects = tables.component_effects(recorded).set_index(["variant", "backbone"])
    all_three = effects.loc["-m-c~s"]
    assert "hurts beyond seed noise on every backbone" in prose
    assert (all_three["gain"] > 0).all() and (all_three["p_welch"] < 0.05).all()
    assert "(−m on LightGCN, ~s on NeuMF) are *better*" in prose
    for variant, backbone in (("-m", "LightGCN"), ("~s", "NeuMF")):
        assert effects.loc[(variant, backbone), "gain"] < 0 and effects.loc[(variant, backbone), "p_welch"] < 0.05
    singles = effects.drop(index="-m-c~s", level="variant")
    assert "single components often do not matter" in prose and (singles["p_welch"] >= 0.05).sum() >= len(singles) / 2


def test_headline_verdict_paragraph_quotes_the_recorded_seeds():
    prose = " ".join(_cell_text(STEM, "is **ahead** of PTF-FedRec").split())
    table1 = lesson.recorded_table("table1")
    headline = lesson.headline_verdicts(table1).set_index(["backbone", "rival"])
    assert set(headline.index.get_level_values("backbone")) == {"NeuMF", "NeuNCF", "LightGCN"}
    assert (headline["seeds"] == "5 vs 5").all()
    ptf = headline.xs("PTF-FedRec", level="rival")
    assert (ptf["verdict"] == "ahead").all()
    for backbone in ("NeuMF", "NeuNCF", "LightGCN"):
        assert f"+{ptf.loc[backbone, 'gap %']:.1f} % on {backbone}" in prose, backbone
    central = headline.xs("Centralized", level="rival")
    assert (central["verdict"] == "behind").all()
    assert f"{central['gap %'].max():.1f} % to {central['gap %'].min():.1f} %".replace("-", "−") in prose
    gnn = headline.xs("FedPerGNN", level="rival")
    assert gnn.loc["NeuMF", "verdict"] == gnn.loc["LightGCN", "verdict"] == "behind"
    assert f"({gnn.loc['NeuMF', 'gap %']:.1f} %, {gnn.loc['LightGCN', 'gap %']:.1f} %)".replace("-", "−") in prose
    assert gnn.loc["NeuNCF", "verdict"] == "within seed noise"
    assert f"({gnn.loc['NeuNCF', 'gap %']:.1f} %, p = {gnn.loc['NeuNCF', 'p']:.2f})".replace("-", "−") in prose
    # the flags the paragraph names are on the rows
    n10 = table1[(table1.dataset == "MovieLens-100K") & (table1.metric == "N@10")]
    assert {"at_cap", "grid_edge"} <= set(n10[n10.method == "FedPerGNN"]["flags"].iloc[0].split(";"))
    assert all("grid_edge" in f for f in n10[n10.method == "Centralized"]["flags"])
    assert all("grid_edge" in f for f in n10[n10.method == "PTF-FedRec"]["flags"])


def test_fair_budget_paragraph_quotes_the_headline_part():
    """Every number the fair-budget paragraph quotes (part headline, three seeds), the direction
    of each claim and the flags it names."""
    prose = " ".join(_cell_text(STEM, "**What a fair budget changes").split())
    fair = lesson.fair_headline().set_index(["method", "backbone"])
    value = lambda method, backbone="": fair.loc[(method, backbone), "value_ours"]  # noqa: E731
    assert (fair["n_seeds"] == 3).all() and "over three seeds" in prose
    verdicts = lesson.fair_headline_verdicts(lesson.fair_headline()).set_index(["backbone", "rival"])
    v = lambda backbone, rival: verdicts.loc[(backbone, rival)]  # noqa: E731
    # "FedKDRec's lead over PTF-FedRec holds on LightGCN alone (27.3 % against 20.2 %, +35.3 %, p = 0.019)"
    light = v("LightGCN", "PTF-FedRec")
    assert light["verdict"] == "ahead"
    assert (f"holds on LightGCN alone ({value('FedKDRec', 'LightGCN'):.1f} % against "
            f"{value('PTF-FedRec', 'LightGCN'):.1f} %, {light['gap %']:+.1f} %, p = {light['p']:.3f})") in prose
    # "On NeuMF and NeuNCF PTF-FedRec is ahead on average (...), within seed noise (p = 0.17 and 0.11)"
    quoted = ", ".join(f"{value('PTF-FedRec', b):.1f} % against {value('FedKDRec', b):.1f} %" for b in ("NeuMF", "NeuNCF"))
    assert f"ahead on average ({quoted})" in prose
    for b in ("NeuMF", "NeuNCF"):
        assert value("PTF-FedRec", b) > value("FedKDRec", b) and v(b, "PTF-FedRec")["verdict"] == "within seed noise"
    assert f"(p = {v('NeuMF', 'PTF-FedRec')['p']:.2f} and {v('NeuNCF', 'PTF-FedRec')['p']:.2f})" in prose
    # "smaller rates than Table 1's (2e-3 on NeuMF and 1e-3 on NeuNCF, against 1e-2)"
    assert fair.loc[("PTF-FedRec", "NeuMF"), "lr"] == 2e-3 and fair.loc[("PTF-FedRec", "NeuNCF"), "lr"] == 1e-3
    assert X.SELECTED["PTF-FedRec"] == 1e-2 and "(2e-3 on NeuMF and 1e-3 on NeuNCF, against 1e-2)" in prose
    # "far above FedKDRec on every backbone (−12.8 % to −23.4 %, every p ≤ 0.011)"
    strongest = verdicts[verdicts.index.get_level_values("rival").isin(["FedPerGNN", "Centralized LightGCN"])]
    assert (strongest["verdict"] == "behind").all() and len(strongest) == 6
    assert (f"({-strongest['gap %'].abs().min():.1f} % to {-strongest['gap %'].abs().max():.1f} %, "
            f"every p ≤ {strongest['p'].max():.3f})").replace("-", "−") in prose
    # "FedPerGNN reaches 35.6 % at 1,600 rounds (30.5 % in Table 1) and centralised LightGCN 35.6 %"
    gnn = fair.loc[("FedPerGNN", "")]
    table1 = lesson.recorded_table("table1")
    t1 = table1[(table1.dataset == "MovieLens-100K") & (table1.metric == "N@10") & (table1.method == "FedPerGNN")]
    assert gnn["cap"] == 1600 and (f"FedPerGNN reaches {gnn['value_ours']:.1f} % at 1,600 rounds "
                                   f"({t1['value_ours'].iloc[0]:.1f} % in Table 1)") in prose
    assert f"centralised LightGCN {value('Centralized LightGCN'):.1f} %" in prose
    # "No choice carries a flag ... (the closest to its cap: PTF-FedRec on LightGCN, round 380 of 400 in one seed)"
    assert not any(fair["flags"]) and "No choice carries a flag" in prose
    share = {(m, b, int(r), row["cap"]): int(r) / row["cap"] for (m, b), row in fair.iterrows() for r in row["best"].split("/")}
    assert max(share.values()) < 1, "the prose says every run selected an evaluation before its last one"
    closest = sorted((key for key, value in share.items() if value == max(share.values())), key=lambda k: k[1] != "NeuMF")
    assert [key[0] for key in closest] == ["PTF-FedRec", "PTF-FedRec"], closest
    (_, first, best, cap), (_, second, *_) = closest
    assert f"(the closest to its cap: round {best} of {cap}, PTF-FedRec in one seed on {first} and one on {second})" in prose
    assert all(fair.loc[("PTF-FedRec", b), "best"].split("/").count(str(best)) == 1 for b in (first, second))
    assert f"its seeds select rounds {gnn['best']})" in prose
    assert X.FAIR["ML-100K"]["PTF-FedRec/NeuNCF"]["lr"] == 1e-3 and "PTF-FedRec on NeuNCF to 5e-4" in prose
    tried = lesson.headline_tuning_frame()
    tried = tried[(tried["method"] == "PTF-FedRec") & (tried["backbone"] == "NeuNCF")]
    assert tried["lr"].min() == 5e-4 and tried["valid N@10"].notna().all()
    gnn_rounds = lesson.headline_tuning_frame().query("method == 'FedPerGNN'")["cap"]
    assert gnn_rounds.max() == 1600, "the prose says FedPerGNN's grid went to 1,600 rounds"


