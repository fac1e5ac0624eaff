"""The F3CRec lesson helpers: figures, the consumed-memory audit, claims and deviation reasons."""
import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.papers.f3crec import experiment as f3crec_experiments
from fedlib.papers.f3crec import figures as f3crec_figures
from fedlib.papers.f3crec import tables as f3crec_tables


def _legend_titles(fig):
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [legend.get_title().get_text() for legend in legends]


def test_forgetting_figure_has_one_panel_per_test_block_and_a_method_legend():
    fake = {"extra": {"accuracy": {"N@20": [[0.3, None, None], [0.1, 0.2, None], [0.08, 0.15, 0.25]]}}}
    curves = f3crec_experiments.forgetting_frame({"FT": fake, "F3CRec": fake})
    fig = f3crec_figures.plot_forgetting(curves)
    assert len(fig.axes) == 2
    assert _legend_titles(fig) == ["method"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["D0", "D1", "D2"]
    assert all(ax.get_ylabel().startswith("N@20") for ax in fig.axes)


def test_sensitivity_figure_has_a_dataset_legend_and_one_y_label():
    sweep = pd.DataFrame([{"dataset": d, "parameter": p, "value": v, "N@20": 0.1 + 0.01 * i}
                          for i, d in enumerate(("A", "B")) for p in ("ε", "λ_KD", "β") for v in (0.1, 0.5)])
    fig = f3crec_figures.plot_sensitivity(sweep)
    assert _legend_titles(fig) == ["dataset"]  # never seaborn's "line"
    assert [ax.get_ylabel() != "" for ax in fig.axes] == [True, False, False]
    assert fig.axes[0].get_xscale() == "log" and fig.axes[2].get_xscale() == "linear"


def test_improvement_figure_labels_settings_without_our_value():
    frame = pd.DataFrame([
        {"dataset": "X", "backbone": "FedMF", "improvement_percent": 5.0, "source": "paper"},
        {"dataset": "X", "backbone": "FedMF", "improvement_percent": -1.0, "source": "ours"},
        {"dataset": "Y", "backbone": "FedMF", "improvement_percent": 2.0, "source": "paper"},
    ])
    fig = f3crec_figures.plot_improvement(frame)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["X · FedMF", "Y · FedMF (ours: needs download)"]
    assert _legend_titles(fig) == ["source"]


def test_memory_consumed_share_counts_training_items_in_the_top_n(monkeypatch):

    class Split:  # two users, four items; user 0 trained on items 0 and 1, user 1 on item 3
        num_users, num_items = 2, 4

        class train:
            indptr = np.array([0, 2, 3])
            items = np.array([0, 1, 3])

    class Model:
        def score_users(self, global_state, private_state, users):
            return torch.tensor([[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.0]])  # top-2: items 0, 1

    class Backbone:
        def make_model(self, num_users, num_items):
            return Model()

    class Base:  # block 0's run: only its selected state is read
        class selected_state:
            global_state, private_state = {"q": torch.zeros(1)}, {}

    monkeypatch.setattr(f3crec_experiments, "make_backbone", lambda config: Backbone())
    share = f3crec_experiments.memory_consumed_share({}, Base(), [Split()], top_n=2)
    assert share == pytest.approx(0.5)  # user 0: both consumed; user 1: neither


def test_lesson_claims_count_every_setting():
    rows = []
    for dataset, f3, best in (("A", 0.12, 0.10), ("B", 0.08, 0.10)):
        for method, ours, paper in (("F3CRec", f3, 0.12), ("FT", best, 0.10), ("KD", best - 0.01, 0.11)):
            rows.append({"dataset": dataset, "backbone": "FedMF", "method": method, "metric": "N@20", "block": "Avg",
                         "value_ours": ours, "value_paper": paper})
    claims = f3crec_tables.lesson_claims(pd.DataFrame(rows)).set_index("claim")
    assert claims.loc["F3CRec has the best N@20 Avg (Table 2)", "ours"] == "1 of 2 settings"
    assert claims.loc["F3CRec has the best N@20 Avg (Table 2)", "paper"] == "2 of 2 settings"


def test_deviation_summary_raises_on_a_cell_without_a_reason():
    frame = pd.DataFrame([{"table": "table9", "dataset": "Z", "method": "Other", "metric": "N@20",
                           "value_ours": 0.1, "value_paper": 0.2}])
    with pytest.raises(ValueError, match="without a reason"):
        f3crec_tables.deviation_summary({"table9": frame})
    frame["dataset"] = "Lastfm-2K"
    summary = f3crec_tables.deviation_summary({"table9": frame})
    assert summary["cells"].tolist() == [1] and summary["Δ % from"].iloc[0] == pytest.approx(-50.0)
