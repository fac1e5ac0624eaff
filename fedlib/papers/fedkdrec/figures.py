"""FedKDRec: Figures 2–4 and the learning curves from the recorded runs (frames, then plots).

Every point is read from ``runs.jsonl`` records (:func:`fedlib.papers.fedkdrec.experiment.run_grid`),
matched to cells by the configuration hash of :func:`fedlib.papers.fedkdrec.experiment.cell`,
as in :mod:`fedlib.papers.fedkdrec.tables` (whose protocol names and metric map it uses).

* Figures 3 and 4 (α and the β range): :func:`sensitivity_frame` / :func:`figure_sensitivity`,
  and :func:`sensitivity_claims` checks what the paper says about them;
* Figure 2 (predictions sent per client and the server loss per round):
  :func:`history_frame` / :func:`figure_communication`;
* the item initialisation (random vs text): :func:`init_frame`;
* learning curves: :func:`curve_frame` (from :func:`results_from_records`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import pandas as pd

from fedlib.papers.fedkdrec.experiment import ALPHAS, BACKBONES, BETA_RANGES, PAPER, cell, method_label
from fedlib.papers.fedkdrec.tables import FULL, METRICS, PAPER_METRICS, SAMPLED
from fedlib.reporting.figures import curve_frame as long_curves
from fedlib.reporting.figures import results_from_records, save_figure, seed_summary_frame
from fedlib.reporting.results import RUN_ID_SEPARATOR, config_hash, latest_records
from fedlib.reporting.results import recorded_seeds as _seeds
from fedlib.reporting.stats import reference_spread_p

__all__ = ["results_from_records", "sensitivity_frame", "sensitivity_claims", "init_frame", "figure_sensitivity",
           "history_frame", "figure_communication", "curve_frame"]


SENSITIVITY_COLUMNS = ["dataset", "backbone", "parameter", "label", "position", "metric", "protocol", "value", "std",
                       "n_seeds", "run_ids"]


def sensitivity_frame(records, cell_kwargs: Mapping = {}, dataset: str = "ML-100K",
                      backbones: Sequence[str] = tuple(BACKBONES)) -> pd.DataFrame:
    """Figures 3 and 4: FedKDRec's N@10 and H@10 as α or the β range varies alone.

    One row per (backbone, parameter, setting, metric, protocol): ``parameter`` is
    ``"alpha"`` or ``"beta"``, ``label`` the setting as printed (``"0.25"``, ``"[0.3, 0.7]"``),
    ``position`` its x coordinate (α, or the middle of the β range), ``value`` and ``std``
    the seed mean and sample standard deviation in percent. Unrecorded settings are absent.
    """
    def point(backbone, parameter, label, position, **setting):
        keys = {"dataset": dataset, "backbone": backbone, "parameter": parameter, "label": label, "position": position}
        return keys, cell(dataset, "FedKDRec", backbone=backbone, **setting, **cell_kwargs)

    points = []
    for b in backbones:
        points += [point(b, "alpha", f"{a:g}", float(a), alpha=a) for a in ALPHAS]
        points += [point(b, "beta", f"[{lo:g}, {hi:g}]", (lo + hi) / 2.0, beta_range=(lo, hi))
                   for lo, hi in BETA_RANGES]
    metrics = {name: {"metric": metric, "protocol": protocol} for name, (metric, protocol) in METRICS.items()}
    return seed_summary_frame(records, points, metrics, SENSITIVITY_COLUMNS, scale=100.0)


SENSITIVITY_CLAIM_COLUMNS = ["claim", "backbone", "metric", "holds", "p", "ours"]


def sensitivity_claims(sweep: pd.DataFrame, metric: str = "N@10", protocol: str = SAMPLED) -> pd.DataFrame:
    """The paper's statements about Figures 3–4 on ML-100K, checked on :func:`sensitivity_frame`.

    * α = 0.5 is the best α (the paper says so for LightGCN, and calls it a robust choice);
    * mixing beats both extremes: α = 0.5 above α = 0 (predictions only, as −m) and α = 1 (hard labels
      only) in Eq. 4's direction (the paper's §4.5 text names the two ends the other way round);
    * β ∈ [0.3, 0.7] is the best range on ML-100K;
    * β ∈ [0.4, 0.8] scores below [0.2, 0.6] (stated for LightGCN).

    ``holds`` compares values; ``p`` whether the decisive gap (to the strongest rival setting)
    exceeds the seed spread. Every sweep point but the default (α = 0.5, β ∈ [0.3, 0.7], the
    Table 1 cell) has one seed, so the default's seed standard deviation stands in for every
    setting's (:func:`reference_spread_p`). A backbone whose sweep is not recorded is left out.
    """
    rows: List[Dict[str, Any]] = []
    frame = sweep[(sweep["metric"] == metric) & (sweep["protocol"] == protocol)]
    for backbone, points in frame.groupby("backbone", sort=False):
        def point(parameter, label):
            hit = points[(points["parameter"] == parameter) & (points["label"] == label)]
            return hit.iloc[0] if len(hit) else None

        default = point("alpha", "0.5")
        if default is None or (points["parameter"] == "alpha").sum() < 2:
            continue
        spread = (float(default["std"]), int(default["n_seeds"]))

        def p_of(x, y) -> float:
            return reference_spread_p(float(x["value"]), int(x["n_seeds"]), float(y["value"]), int(y["n_seeds"]),
                                       *spread)

        def add(claim, holds, p, ours):
            rows.append({"claim": claim, "backbone": backbone, "metric": metric, "holds": holds, "p": p, "ours": ours})

        for parameter, best_label, claim in (("alpha", "0.5", "α = 0.5 is the best α"),
                                             ("beta", "[0.3, 0.7]", "β ∈ [0.3, 0.7] is the best range")):
            mine = point(parameter, best_label)
            others = points[(points["parameter"] == parameter) & (points["label"] != best_label)]
            if mine is None or others.empty:
                continue
            rival = others.loc[others["value"].idxmax()]
            add(claim, bool(mine["value"] >= rival["value"]), p_of(mine, rival),
                f"{best_label}: {mine['value']:.2f} vs best other {rival['label']}: {rival['value']:.2f} (%)")
        ends = [point("alpha", "0"), point("alpha", "1")]
        if all(e is not None for e in ends):
            stronger = max(ends, key=lambda e: e["value"])
            add("mixing beats both extremes (α = 0.5 above α = 0 and α = 1)",
                bool(default["value"] > max(e["value"] for e in ends)), p_of(default, stronger),
                f"α = 0.5: {default['value']:.2f} vs α = 0: {ends[0]['value']:.2f}, α = 1: {ends[1]['value']:.2f} (%)")
        high, low = point("beta", "[0.4, 0.8]"), point("beta", "[0.2, 0.6]")
        if high is not None and low is not None:
            add("β ∈ [0.4, 0.8] below [0.2, 0.6]", bool(high["value"] < low["value"]), p_of(high, low),
                f"[0.4, 0.8]: {high['value']:.2f} vs [0.2, 0.6]: {low['value']:.2f} (%)")
    frame = pd.DataFrame(rows, columns=SENSITIVITY_CLAIM_COLUMNS)
    frame["holds"] = frame["holds"].astype(object)
    return frame


INIT_COLUMNS = ["dataset", "backbone", "method", "seed", "metric", "protocol", "random", "text", "text - random",
                "run_ids"]


def init_frame(records, cell_kwargs: Mapping = {}, dataset: str = "ML-100K", backbone: str = "NeuMF",
               methods: Sequence[str] = ("Centralized", "PTF-FedRec", "FedKDRec")) -> pd.DataFrame:
    """Item initialisation: random vs the side-information text autoencoder, run by run.

    One row per (method, seed, metric, protocol) for which **both** inits are recorded (so the
    two columns always compare the same seed): ``random`` and ``text`` in percent and their
    difference. Seeds with a single init are left out rather than compared across seeds.
    """
    known, rows = latest_records(records), []
    for method in methods:
        for seed in _seeds(records):
            pair = {init: known.get(config_hash({**cell(dataset, method, backbone=backbone, init=init, **cell_kwargs),
                                                 "seed": seed}))
                    for init in ("random", "text")}
            if any(run is None for run in pair.values()):
                continue
            for name, (metric, protocol) in METRICS.items():
                values = {init: run.metrics.get(name) for init, run in pair.items()}
                if any(v is None for v in values.values()):
                    continue
                random_init, text_init = 100.0 * float(values["random"]), 100.0 * float(values["text"])
                rows.append({"dataset": dataset, "backbone": backbone, "method": method, "seed": seed,
                             "metric": metric, "protocol": protocol, "random": random_init, "text": text_init,
                             "text - random": text_init - random_init,
                             "run_ids": RUN_ID_SEPARATOR.join(run.config_hash for run in pair.values())})
    return pd.DataFrame(rows, columns=INIT_COLUMNS)


def figure_sensitivity(frame: pd.DataFrame, name: Optional[str] = None, *, profile: str = "paper",
                       protocol: str = SAMPLED):
    """Figures 3 (α) and 4 (β range) from :func:`sensitivity_frame`: one row of panels per parameter.

    Each row has an N@10 and an H@10 panel (percent, ``protocol``), one line per backbone.
    Returns the figure (``None`` when ``frame`` has no point under ``protocol``); with
    ``name`` it is also saved as ``figures/fedkdrec/<name>.png`` (:func:`~fedlib.reporting.save_figure`).
    """
    import matplotlib.pyplot as plt

    part = frame[frame["protocol"] == protocol] if len(frame) else frame
    if part.empty:
        return None
    parameters = [p for p in ("alpha", "beta") if p in set(part["parameter"])]
    fig, axes = plt.subplots(len(parameters), len(PAPER_METRICS), figsize=(9.0, 3.2 * len(parameters)), squeeze=False)
    titles = {"alpha": "α (Eq. 4)", "beta": "β range (sample ratio)"}
    for row, parameter in zip(axes, parameters):
        sweep = part[part["parameter"] == parameter].sort_values("position")
        ticks = sweep.drop_duplicates("position")
        for ax, metric in zip(row, PAPER_METRICS):
            for b in [b for b in BACKBONES if b in set(sweep["backbone"])]:
                line = sweep[(sweep["backbone"] == b) & (sweep["metric"] == metric)]
                ax.errorbar(line["position"], line["value"], yerr=line["std"].fillna(0.0), marker="o", capsize=3,
                            label=b)
            ax.set_xticks(ticks["position"].tolist(), ticks["label"].tolist())
            ax.set_xlabel(titles[parameter])
            ax.set_ylabel(f"{metric} (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    # one legend for every panel, right of the grid, so that it never covers a line
    fig.legend(handles, labels, title="backbone", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle(f"FedKDRec sensitivity ({protocol}; error bars: std over the default setting's seeds)")
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig


HISTORY_COLUMNS = ("round", "server_loss", "client_loss", "sent_per_client", "uploaded_per_client",
                   "teacher_entropy", "teacher_loss", "label_revealed", "critic_loss", "actor_loss", "seconds")


def history_frame(result: Mapping[str, Any]) -> pd.DataFrame:
    """The per-round history of one FedKDRec/PTF-FedRec run, with its dataset, backbone, method and seed.

    ``sent_per_client`` / ``uploaded_per_client`` are mean predictions per selected client
    (server → client / client → server); with the run's communication record,
    ``download_bytes_per_client`` and ``upload_bytes_per_client`` are the mean bytes. Empty
    for a run without a history (parameter-transfer and centralised runs).
    """
    config, extra = result["config"], result.get("extra") or {}
    frame = pd.DataFrame(extra.get("history") or [])
    if frame.empty:
        return frame
    frame = frame[[c for c in HISTORY_COLUMNS if c in frame.columns]].copy()
    for direction, column in (("download", "download_bytes_per_client"), ("upload", "upload_bytes_per_client")):
        values = (extra.get("communication") or {}).get(direction)
        if values is not None and len(values) == len(frame):  # one entry per round that sent something
            frame[column] = values
    frame.insert(0, "seed", config.get("seed"))
    frame.insert(0, "method", method_label(config))
    frame.insert(0, "backbone", config.get("backbone"))
    frame.insert(0, "dataset", config.get("dataset"))
    return frame


def _default_kd(config: Mapping[str, Any], variant: str) -> bool:
    """A FedKDRec run of ``variant`` at the default α, β range, init and learning rate (any rounds)."""
    if config.get("method") != "FedKDRec" or config.get("backbone") not in BACKBONES:
        return False
    reference = cell(config["dataset"], "FedKDRec", backbone=config["backbone"], variant=variant)
    return all(config.get(k) == reference[k] for k in ("variant", "alpha", "beta_range", "init", "lr", "dim",
                                                          "client_fraction"))


def figure_communication(results: Sequence[Mapping[str, Any]], name: Optional[str] = None, *,
                         profile: str = "paper", dataset: Optional[str] = None, variant: str = "FedKDRec"):
    """Figure 2: predictions sent per client per round (bars) and the server loss (line, right axis).

    One panel per backbone, each drawn from one run of ``variant`` at the default α, β
    range, item init and learning rate (so α/β-sweep and tuning runs are never drawn), on
    ``dataset`` (default: any); among several, the lowest seed, then the most rounds.
    Returns ``None`` when no such run has a history; with ``name`` the figure is also saved
    under ``figures/fedkdrec/``.
    """
    import matplotlib.pyplot as plt

    chosen = {}
    for b in BACKBONES:
        runs = [r for r in results if r["config"].get("backbone") == b and _default_kd(r["config"], variant)
                and (dataset is None or r["config"]["dataset"] == dataset)]
        runs = sorted(runs, key=lambda r: (r["config"]["seed"], -r["config"]["rounds"]))
        frames = [f for f in (history_frame(r) for r in runs) if len(f)]
        if frames:
            chosen[b] = frames[0]
    if not chosen:
        return None
    fig, axes = plt.subplots(1, len(chosen), figsize=(5.0 * len(chosen), 3.4), squeeze=False)
    twins = []
    for ax, (b, frame) in zip(axes[0], chosen.items()):
        ax.bar(frame["round"], frame["sent_per_client"], width=1.0, color="C0", alpha=0.55,
               label="predictions sent per client")
        ax.set_xlabel("round")
        ax.set_ylabel("predictions sent per client")
        twin = ax.twinx()
        twin.plot(frame["round"], frame["server_loss"], color="C3", lw=1.2, label="server loss")
        twin.set_ylabel("server loss")
        twin.grid(False)
        twins.append(twin)
        ax.set_title(f"{b} (seed {int(frame['seed'].iloc[0])})")
    # the bars and the line live on two axes: one legend with both
    bars, line = axes[0][0].get_legend_handles_labels(), twins[0].get_legend_handles_labels()
    axes[0][0].legend(bars[0] + line[0], bars[1] + line[1], loc="upper right", fontsize="small")
    datasets = ", ".join(sorted({str(f["dataset"].iloc[0]) for f in chosen.values()}))
    fig.suptitle(f"{variant}: predictions sent and server loss per round ({datasets})")
    fig.tight_layout()
    save_figure(fig, PAPER, name, profile)
    return fig


def curve_frame(results: Sequence[Mapping[str, Any]], metric: str = "NDCG@10", which: str = "test") -> pd.DataFrame:
    """Long frame of learning curves: one row per (run, evaluation, protocol); ``value`` as recorded (fraction).

    ``metric`` is either protocol-qualified (``"sampled/HR@10"``, ``"full/NDCG@10"``) or bare
    (``"NDCG@10"``: both protocols that record it); ``which`` is ``"test"`` or ``"valid"``.
    """
    names = {"sampled": SAMPLED, "full": FULL}
    qualified = metric.split("/", 1)[0] in names
    wanted = ([(metric, names[metric.split("/", 1)[0]])] if qualified
              else [(f"{p}/{metric}", n) for p, n in names.items()])
    series = {f"{which}/{name}": {"metric": name.split("/", 1)[1], "protocol": protocol, "which": which}
              for name, protocol in wanted}
    return long_curves(results, lambda config: {"dataset": config["dataset"], "method": method_label(config),
                                                "backbone": config.get("backbone"), "variant": config.get("variant")},
                       ["dataset", "method", "backbone", "variant", "seed", "round", "metric", "protocol", "which",
                        "value"], series=series)
