"""Numbers quoted in the notebooks' prose agree with the committed paper-profile tables.

The narrative cells name recorded results in words; when a cell is re-run and its table
changes, these tests fail until the prose is updated.
"""
import re

import pandas as pd
import pytest

from fedlib.paths import project_root

ROOT = project_root()


def _paragraph(notebook: str, heading: str) -> str:
    """The markdown paragraph of ``notebooks/<notebook>.py`` that contains ``heading``."""
    text = (ROOT / "notebooks" / f"{notebook}.py").read_text()
    cells = text.split("# %%")
    found = [cell for cell in cells if heading in cell]
    assert len(found) == 1, f"expected one cell with {heading!r} in {notebook}.py, found {len(found)}"
    return re.sub(r"\n#\s?", " ", found[0])


def _ours(table: str, method: str, domain: str, dataset: str = "Food-Kitchen", metric: str = "MRR") -> float:
    frame = pd.read_csv(ROOT / "results" / "fedcsr" / f"{table}.csv")
    row = frame[(frame.dataset == dataset) & (frame.domain == domain) & (frame.method == method)
                & (frame.metric == metric)]
    assert len(row) == 1 and pd.notna(row.value_ours.iloc[0]), (table, method, domain)
    return float(row.value_ours.iloc[0])


FEDCSR_ABLATION = [  # (words in the prose, table, method row)
    ("FedCSR", "table3", "FedCSR (SCL + MCL)"),
    ("w/o SCL", None, None),
    ("w/o MCL (the paper's \"SCL only\")", "table3", "SCL only (w/o MCL)"),
    ("w/o SCL & MCL", "table3", "w/o SCL & MCL"),
    ("without the single-domain heads", "figure2", "w/o single"),
    ("without the unified head", "figure2", "w/o unified"),
]


@pytest.mark.parametrize("words, table, method", FEDCSR_ABLATION)
def test_fedcsr_ablation_paragraph_quotes_the_recorded_mrr(words, table, method):
    if method is None:  # "w/o SCL" (MCL only) is ours: no paper row, read from the run records
        from fedlib.reporting import read_runs
        runs = [r for r in read_runs("fedcsr", "paper") if r.config.get("variant") == "w/o SCL"
                and r.config.get("dataset") == "Food-Kitchen" and r.config.get("dim") == 64]
        assert runs, "no recorded 'w/o SCL' run"
        food, kitchen = (100 * runs[-1].metrics[f"{d}/test/MRR"] for d in ("Food", "Kitchen"))
    else:
        food, kitchen = _ours(table, method, "Food"), _ours(table, method, "Kitchen")
    prose = _paragraph("05_fedcsr", "What the recorded Food-Kitchen ablation shows")
    quoted = f"{words} {food:.2f} / {kitchen:.2f}"
    assert quoted in prose, f"notebook 05 should quote {quoted!r} (the recorded values)"


def test_fedcsr_ablation_paragraph_quotes_the_recomputed_gain():
    prose = _paragraph("05_fedcsr", "What the recorded Food-Kitchen ablation shows")
    gain_food = _ours("table3", "FedCSR (SCL + MCL)", "Food") - _ours("table3", "w/o SCL & MCL", "Food")
    gain_kitchen = _ours("table3", "FedCSR (SCL + MCL)", "Kitchen") - _ours("table3", "w/o SCL & MCL", "Kitchen")
    assert f"add {gain_food:.2f} on Food" in prose
    assert f"take {-gain_kitchen:.2f} from Kitchen" in prose


def test_fedrkg_lastfm_leaky_bullet_quotes_the_recorded_r10():
    frame = pd.read_csv(ROOT / "results" / "fedrkg" / "table1.csv")
    rows = frame[(frame.dataset == "LastFM-2K") & (frame.metric == "R@10") & (frame.sampler == "leaky")]
    prose = _paragraph("01_fedrkg", "On LastFM-2K the leak lifts FedRKG only")
    for method in ("MF", "CoFedRec", "NeuMF", "FedMF", "FedNCF", "PFedRec"):
        value = rows[rows.method == method].value_ours.iloc[0]
        assert f"{method} {value:.2f}" in prose, (method, value)
    feddae = rows[rows.method == "FedDAE"].value_ours.iloc[0]
    assert f"FedDAE stays at {feddae:.2f}" in prose
