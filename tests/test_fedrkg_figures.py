"""FedRKG figures from (fabricated) results: which runs each figure draws, and no empty figures."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import fedlib.experiments.fedrkg as X  # noqa: E402
import fedlib.experiments.fedrkg_figures as F  # noqa: E402


def result(config, final=0.5, rounds=(10, 20, 30)):
    curve = [{"round": r, "test/Recall@10": final * r / rounds[-1], "valid/Recall@10": final} for r in rounds]
    return {"config": config, "metrics": {"Recall@10": final, "best_round": rounds[-1]}, "extra": {"curve": curve}}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_sensitivity_frame_takes_one_changed_parameter_at_a_time():
    results = [result(c, final=0.1 * i) for i, c in enumerate(X.sensitivity_cells("Amazon-Video", "leaky"))]
    # a run with two parameters changed belongs to no sweep
    results.append(result(X.cell("Amazon-Video", "FedRKG", sampler="leaky", interval=10,
                                 params={"beta": 0.9}), final=0.99))
    frame = F.sensitivity_frame(results, "Amazon-Video")
    assert set(frame["parameter"]) == {"gate_lr", "beta", "interval"}
    assert sorted(frame[frame.parameter == "gate_lr"]["value"]) == sorted(X.GATE_LRS)
    assert sorted(frame[frame.parameter == "interval"]["value"]) == sorted(X.INTERVALS)
    assert 99.0 not in set(frame["score"].round(6))
    assert F.sensitivity_figure(results, "Amazon-Video") is not None


def test_figures_are_none_without_their_runs_and_drawn_with_them():
    assert F.figure2([], "Amazon-Video") is None
    assert F.convergence_figure([], 100) is None
    assert F.interval_figure([], "Amazon-Video") is None
    assert F.sensitivity_figure([], "Amazon-Video") is None
    assert F.trace_figure(F.trace_frame([], "FilmTrust")) is None
    runs = [result(c) for c in X.figure2_cells("Amazon-Video", "leaky")]
    assert F.figure2(runs, "Amazon-Video") is not None
    assert F.figure2(runs, "FilmTrust") is None  # other dataset: nothing to draw
    assert F.interval_figure([result(c) for c in X.interval_cells("Amazon-Video", "leaky")], "Amazon-Video") is not None
    assert F.convergence_figure(runs, 100) is not None


def test_convergence_figure_skips_private_and_probe_runs():
    ldp_only = [result(X.cell("FilmTrust", "FedRKG", sampler="correct", ldp=X.LDP))]
    assert F.convergence_figure(ldp_only, 100) is None
