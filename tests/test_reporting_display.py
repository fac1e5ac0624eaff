"""Paper tables loader, figures and the paper-vs-ours display."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from fedlib.paths import PAPER_SLUGS  # noqa: E402
from fedlib.reporting.display import FLAG, LEGEND, RECORDED_SOURCE, comparison_long, paper_vs_ours  # noqa: E402
from fedlib.reporting.figures import save_figure  # noqa: E402
from fedlib.data.paper_tables import list_paper_tables, load_paper_table, paper_key_columns  # noqa: E402
from fedlib.reporting.results import compare_with_paper  # noqa: E402

# ------------------------------------------------------------------ paper tables (real files)


def test_every_paper_table_loads_with_unique_keys():
    total = 0
    for paper in PAPER_SLUGS:
        tables = list_paper_tables(paper)
        assert "table1" in tables and tables == sorted(tables)
        for table_id in tables:
            table = load_paper_table(paper, table_id)
            assert set(table["table"]) == {table_id}
            assert not table.duplicated(paper_key_columns(table)).any()
            assert table["value"].dtype == float
            total += len(table)
    assert total == 2617  # the row total stated in paper_tables/README.md


def test_table_lookup_by_id_or_file_stem_and_helpful_errors():
    by_id = load_paper_table("f3crec", "table2")
    assert by_id.equals(load_paper_table("f3crec", "table2_main"))
    assert by_id["value"].isna().sum() == 6  # RLP2 is out of memory on HetRec2011
    assert (by_id["marker"] == "").any()  # missing text stays "" rather than NaN
    with pytest.raises(KeyError, match=r"available tables: table1 \(table1_data_blocks.csv\)"):
        load_paper_table("f3crec", "table42")
    with pytest.raises(ValueError, match="unknown paper slug"):
        load_paper_table("f3c", "table1")


# ------------------------------------------------------------------ figures


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(tmp_path))
    return tmp_path


def _figure():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [0.1, 0.3, 0.2], label="F3CRec")
    ax.legend()
    return fig


def test_figures_have_deterministic_names_and_bytes(project):
    fig = _figure()
    paths = save_figure(fig, "f3crec", "fig4_sensitivity", "quick", formats=("png", "svg", "pdf"))
    assert paths == [project / "figures" / "f3crec" / f"fig4_sensitivity.{ext}" for ext in ("png", "svg", "pdf")]
    first = [path.read_bytes() for path in paths]
    plt.close(fig)
    fig = _figure()
    second = [path.read_bytes() for path in save_figure(fig, "f3crec", "fig4_sensitivity", "quick", ("png", "svg", "pdf"))]
    plt.close(fig)
    assert first == second
    assert b"Matplotlib version" not in first[0]  # no software stamp in the PNG
    assert b"CreationDate" not in first[2]


def test_smoke_figures_stay_out_of_the_committed_folder(project):
    fig = _figure()
    [path] = save_figure(fig, "f3crec", "fig4", "smoke")
    plt.close(fig)
    assert path == project / "figures" / "f3crec" / "smoke" / "fig4.png"


@pytest.mark.parametrize("name", ["../fig4", "a/b", "", "fig 4", ".hidden", "fig4.png"])
def test_unsafe_figure_names_are_refused(project, name):
    fig = _figure()
    with pytest.raises(ValueError, match="safe file name"):
        save_figure(fig, "f3crec", name, "quick")
    plt.close(fig)
    assert not (project / "figures").exists()


def test_use_style_sets_the_common_look():
    from fedlib.reporting.figures import use_style

    with matplotlib.rc_context():  # restore the global style for the other tests
        use_style()
        assert matplotlib.rcParams["savefig.dpi"] == 150
        assert not matplotlib.rcParams["legend.frameon"]
        assert matplotlib.rcParams["axes.grid"]  # seaborn whitegrid


def test_unknown_formats_and_profiles_are_refused(project):
    fig = _figure()
    with pytest.raises(ValueError, match="format"):
        save_figure(fig, "f3crec", "fig4", "quick", formats=("jpg",))
    with pytest.raises(ValueError, match="profile"):
        save_figure(fig, "f3crec", "fig4", "full")
    plt.close(fig)


# ------------------------------------------------------------------ display

KEYS = ["dataset", "method", "metric"]


def _paper():
    frame = pd.DataFrame(
        [
            ("ML-100K", "FT", "N@20", 0.1111, "fraction", "high"),
            ("ML-100K", "KD", "N@20", 0.2222, "fraction", "uncertain"),
            ("HetRec2011", "FT", "N@20", 0.3333, "fraction", "reconstructed"),
        ],
        columns=KEYS + ["value", "unit", "confidence"],
    )
    frame.insert(0, "table", "table2")
    return frame


def _results(profile, values):
    ours = pd.DataFrame([("ML-100K", m, "N@20", v) for m, v in values.items()], columns=KEYS + ["value"])
    return compare_with_paper(
        ours, _paper(), KEYS, profile=profile, missing_note="dataset needs download", commit="c", device="cpu"
    )


def test_paper_numbers_never_appear_in_an_ours_column():
    live = _results("quick", {"FT": 0.1000, "KD": 0.2500})
    table = paper_vs_ours(live, styled=False)
    ours_column = "ours (live, quick)"
    assert list(table.columns) == ["dataset", "method", "metric", "paper", ours_column, "Δ (live, quick)"]
    missing = table[table.dataset == "HetRec2011"].iloc[0]
    assert "0.3333" not in missing[ours_column] and "needs download" in missing[ours_column]
    assert missing["paper"] == "0.3333" + FLAG  # reconstructed
    assert table[table.method == "KD"].iloc[0]["paper"] == "0.2222" + FLAG  # uncertain
    assert table[table.method == "FT"].iloc[0]["paper"] == "0.1111"  # high: no mark
    assert table[table.method == "KD"].iloc[0]["Δ (live, quick)"] == "+0.0278 (+12.5%)"
    assert LEGEND in table.attrs["legend"] and "table = table2" in table.attrs["legend"]


def test_recorded_and_live_numbers_are_labelled_side_by_side():
    live = _results("quick", {"FT": 0.1000})
    recorded = _results("paper", {"FT": 0.1200, "KD": 0.2000})
    recorded.attrs["recorded"] = True
    table = paper_vs_ours(live, recorded, styled=False)
    assert [c for c in table.columns if c.startswith(("ours", "Δ"))] == [
        "ours (live, quick)", "Δ (live, quick)", RECORDED_SOURCE, "Δ (recorded, paper profile)",
    ]
    kd = table[table.method == "KD"].iloc[0]
    assert kd[RECORDED_SOURCE] == "0.2000" and kd["ours (live, quick)"].startswith("—")
    long = comparison_long(live, recorded)
    assert set(long["source"]) == {"paper", "ours (live, quick)", RECORDED_SOURCE}
    assert long[long.source != "paper"]["value"].dropna().tolist() == [0.1, 0.12, 0.2]
    # Only a paper-profile table can be labelled as recorded.
    with pytest.raises(ValueError, match="paper-profile"):
        paper_vs_ours(None, live)


def test_styled_output_carries_the_legend():
    live = _results("quick", {"FT": 0.1000, "KD": 0.2500})
    html = paper_vs_ours(live).to_html()
    assert "dataset needs download" in html and FLAG in html and "recorded" in html
    assert not math.isnan(live["value_paper"].iloc[0])
