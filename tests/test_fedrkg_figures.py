"""FedRKG figures from (fabricated) results: which runs each figure draws, and no empty figures."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import fedlib.papers.fedrkg.experiment as X  # noqa: E402
import fedlib.papers.fedrkg.figures as F  # noqa: E402


def result(config, final=0.5, rounds=(10, 20, 30)):
    curve = [{"round": r, "test/Recall@10": final * r / rounds[-1], "valid/Recall@10": final} for r in rounds]
    return {"config": config, "metrics": {"Recall@10": final, "best_round": rounds[-1]}, "extra": {"curve": curve}}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_sensitivity_frame_takes_one_changed_parameter_at_a_time():
    results = [result(c, final=0.1 * i) for i, c in enumerate(X.part_cells("sensitivity"))]
    # a run with two parameters changed belongs to no sweep
    results.append(result(X.cell("Amazon-Video", "FedRKG", sampler="leaky", interval=10,
                                 params={"beta": 0.9}), final=0.99))
    frame = F.sensitivity_frame(results, "Amazon-Video")
    assert set(frame["parameter"]) == {"gate_lr", "beta", "interval"}
    assert sorted(frame[frame.parameter == "gate_lr"]["value"]) == sorted(X.SPEC.list("gate_lrs"))
    assert sorted(frame[frame.parameter == "interval"]["value"]) == sorted(X.SPEC.list("intervals"))
    assert 99.0 not in set(frame["score"].round(6))
    assert F.sensitivity_figure(results, "Amazon-Video") is not None


def test_figures_are_none_without_their_runs_and_drawn_with_them():
    assert F.figure2([], "Amazon-Video") is None
    assert F.convergence_figure([], 100) is None
    assert F.interval_figure([], "Amazon-Video") is None
    assert F.sensitivity_figure([], "Amazon-Video") is None
    assert F.trace_figure(F.trace_frame([], "FilmTrust")) is None
    runs = [result(c) for c in X.part_cells("figure2")]
    assert F.figure2(runs, "Amazon-Video") is not None
    assert F.figure2(runs, "FilmTrust") is None  # other dataset: nothing to draw
    assert F.interval_figure([result(c) for c in X.part_cells("interval")], "Amazon-Video") is not None
    assert F.convergence_figure(runs, 100) is not None


def test_convergence_figure_skips_private_and_probe_runs():
    ldp_only = [result(X.cell("FilmTrust", "FedRKG", sampler="correct", ldp=X.LDP))]
    assert F.convergence_figure(ldp_only, 100) is None


def stepped_result(config, jump, rounds=range(10, 301, 10), interval=100, slope=0.001):
    """A curve rising by ``slope`` per round plus ``jump`` after each guidance round (0 = no guidance)."""
    scheduled = X.guidance_rounds(max(rounds), interval)
    curve = [{"round": r, "test/Recall@10": slope * r + jump * sum(t < r for t in scheduled)} for r in rounds]
    return {"config": config, "metrics": {"Recall@10": curve[-1]["test/Recall@10"]}, "extra": {"curve": curve}}


def test_step_gains_take_the_evaluations_on_either_side_of_each_guidance_round():
    import pandas as pd

    fedrkg = stepped_result(X.cell("FilmTrust", "FedRKG", sampler="correct"), jump=0.05)
    fedmf = stepped_result(X.cell("FilmTrust", "FedMF", sampler="correct"), jump=0.0)
    curves = F.curve_frame([fedrkg, fedmf])
    gains = F.step_gains(curves, X.guidance_rounds(300, 100))  # guidance before 0-based rounds 101 and 201
    assert list(gains.columns) == F.GAIN_COLUMNS
    rkg = gains[gains.method == "FedRKG"].set_index("guidance_round")
    assert rkg.index.tolist() == [101, 201] and rkg["guided"].all()
    assert rkg["round_before"].tolist() == [100, 200] and rkg["round_after"].tolist() == [110, 210]
    # ten rounds of slope plus the jump; the values are the curve's own
    assert rkg["gain"].tolist() == pytest.approx([0.01 + 0.05, 0.01 + 0.05])
    assert rkg.loc[201, "value_before"] == pytest.approx(0.2 + 0.05)
    mf = gains[gains.method == "FedMF"]
    assert not mf["guided"].any() and mf["gain"].tolist() == pytest.approx([0.01, 0.01])
    # a guidance round with no evaluation after it (the run stopped early) has no step
    short = curves[curves["round"] <= 150]
    assert F.step_gains(short, [101, 201])["guidance_round"].tolist() == [101, 101]
    # an evaluation exactly at the guidance round is "before" (guidance runs after t completed rounds)
    on_time = pd.DataFrame({"dataset": "d", "method": "w/o AG", "sampler": "leaky", "round": [20, 21, 30],
                            "value": [0.1, 0.2, 0.5]})
    row = F.step_gains(on_time, [21]).iloc[0]
    assert (row["round_before"], row["round_after"], row["gain"]) == (21, 30, pytest.approx(0.3))
    assert F.step_gains(curves.iloc[0:0], [101]).empty and F.step_gains(curves, []).empty


def test_convergence_figure_marks_the_steps_it_returns():
    runs = [stepped_result(X.cell("Amazon-Video", "FedRKG", sampler="leaky"), jump=0.05),
            stepped_result(X.cell("Amazon-Video", "FedRKG", guidance="personal_only", sampler="leaky"), jump=0.0),
            stepped_result(X.cell("Amazon-Video", "FedMF", sampler="leaky"), jump=0.0)]
    gains = F.convergence_gains(runs, 100)
    assert set(gains["method"]) == {"FedRKG", "w/ PIE", "FedMF"}
    assert gains.set_index("method")["guided"].groupby(level=0).all().to_dict() == {
        "FedRKG": True, "w/ PIE": False, "FedMF": False}
    fig = F.convergence_figure(runs, 100)
    ax = fig.axes[0]
    after_markers = [line for line in ax.lines if line.get_marker() == "^"]
    assert len(after_markers) == int(gains["guided"].sum()) == 2  # one per guided curve and guidance round
    assert sorted(text.get_text() for text in ax.texts) == ["+6.0", "+6.0"]  # FedRKG's steps, in points
    assert F.convergence_gains([], 100).empty


def test_figure2_marks_knowledge_guidance_steps():
    runs = [stepped_result(c, jump=0.05 if X.method_label(c) == "w/o AG" else 0.0)
            for c in X.part_cells("figure2")]
    ax = F.figure2(runs, "Amazon-Video").axes[0]
    assert len([line for line in ax.lines if line.get_marker() == "^"]) == 2
    assert [text.get_text() for text in ax.texts] == ["+6.0", "+6.0"]
