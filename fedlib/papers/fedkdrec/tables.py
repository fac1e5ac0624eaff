"""FedKDRec: from recorded runs to the paper's Tables 1–5 (paper vs ours) and its claims.

Every number is read from ``runs.jsonl`` records written by
:func:`fedlib.papers.fedkdrec.experiment.run_grid` or :func:`~fedlib.papers.fedkdrec.experiment.run_cells`,
matched to table cells by the configuration hash of :func:`fedlib.papers.fedkdrec.experiment.cell`
(with every recorded seed; ours are seed means, ``std_ours`` the sample standard deviation).
The tables are laid out as data (``[tables]`` of ``spec.toml``, which also says how our two
ranking protocols meet the paper's numbers) and built by :func:`fedlib.experiments.spec.build_table`;
files are named by the paper's table ids (``results/fedkdrec[/profile]/table1.csv`` ...). This
module holds what is table-specific:

* Table 1's ``rel_change_vs_centralized_<B>`` rows, ``100·(method / Centralized(B) − 1)`` of our
  means, and Table 2's ``rel_drop_vs_full``, ``100·(variant / FedKDRec − 1)``; each carries the
  ids, commits and devices of the runs of both rows, an empty ``run_metric`` and a note;
* Tables 3 and 4: the received bytes in the paper's binary MB or KB (derived rows as well);
* Table 5: the statistics of the split we train on, recorded as runs by
  :func:`data_statistics_records` so that every value has a run record;
* :func:`claims`, :func:`claims_verdict` and :func:`component_effects`: the paper's headline
  statements checked on our numbers. Figures 2–4 and the learning curves are in
  :mod:`fedlib.papers.fedkdrec.figures`.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from fedlib.experiments import grid
from fedlib.experiments.spec import TableContext, build_table, derived_row, metric_units
from fedlib.papers.fedkdrec.experiment import BACKBONES, OFFLINE_DATASETS, PAPER, SPEC, cell, flag_rules, load_split
from fedlib.reporting import load_paper_table  # noqa: F401  (tests compare with the paper's tables)
from fedlib.reporting.stats import describe_p, welch_p

__all__ = ["SAMPLED", "FULL", "METRICS", "BYTES_PER_UNIT", "data_statistics_records", "paper_table", "table1",
           "table2", "table3", "table4", "table5", "all_tables", "write_tables", "claims", "claims_verdict",
           "component_effects"]

SAMPLED, FULL = SPEC.list("protocols")  # "sampled 1+99", "full ranking"
#: our metric -> (the paper's metric, protocol)
METRICS = {"sampled/NDCG@10": ("N@10", SAMPLED), "sampled/HR@10": ("H@10", SAMPLED),
           "full/NDCG@10": ("N@10", FULL), "full/Recall@10": ("H@10", FULL)}
PAPER_METRICS = ("N@10", "H@10")
PARAMETER_BASELINES = tuple(SPEC.list("parameter_baselines"))
TABLE2_VARIANTS = tuple(SPEC.list("table2_variants"))
DOWNLOAD = "download_bytes_per_client_round"
COMM_METRIC = SPEC.table("table3_comm_cost")["columns"]["metric"]
#: Table 3's row of FedKDRec per backbone ("NeuCF" is how the paper prints NeuNCF there)
TABLE3_FEDKDREC = {"NeuMF": "FedKDRec(NeuMF)", "NeuNCF": "FedKDRec(NeuCF)", "LightGCN": "FedKDRec(LightGCN)"}
#: binary multiples, as the paper's Table 3 (0.205 MB = 215,296 B / 1024²)
BYTES_PER_UNIT = {"B": 1, "KB": 1024, "MB": 1024 ** 2}


# ======================================================================================
# The layouts' hooks (spec.toml names them)
# ======================================================================================
def _protocol_notes(ours: pd.DataFrame) -> pd.DataFrame:
    recall = "full ranking: full/Recall@10 as H@10 (one test item per user: Recall@10 = HR@10)"
    ours["note"] = np.where(ours["protocol"] == FULL, np.where(ours["metric"] == "H@10", recall,
                                                               "full ranking: full/NDCG@10"), "")
    return ours


def _relative(ours: pd.DataFrame, context: TableContext, reference_of, stat_of, note_of) -> pd.DataFrame:
    """``ours`` (with the protocol notes) and derived ``100·(value / reference − 1)`` rows (percent).

    ``reference_of(row)`` gives the key values that differ in the reference row (or ``None``: no
    derived row); ``stat_of`` and ``note_of`` take ``(row, reference)``. A derived row carries
    the runs of both rows (ids, commits, devices), so the consistency check finds every run.
    """
    if ours.empty:
        return ours
    ours = _protocol_notes(ours)
    keys = [k for k in SPEC.table(context.table_id)["keys"] if k != "stat"]
    lookup = {tuple(str(r[k]) for k in keys): r for _, r in ours.iterrows()}
    rows = []
    for _, row in ours.iterrows():
        target = reference_of(row)
        reference = None if target is None else lookup.get(tuple(str(target.get(k, row[k])) for k in keys))
        if reference is None or not reference["value"] > 0 or not math.isfinite(row["value"]):
            continue
        runs = [run for r in (row, reference) for run in context.runs_of(
            dataset=r["dataset"], backbone=r["backbone"], method=r["method"])]
        rows.append(derived_row({**{k: row[k] for k in keys}, "stat": stat_of(row, reference)},
                                100.0 * (row["value"] / reference["value"] - 1.0), runs, note_of(row, reference),
                                "percent", provenance=True))
    return pd.concat([ours, pd.DataFrame(rows)], ignore_index=True) if rows else ours


def _change_vs_centralized(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """Table 1: each method against Centralized with its backbone (a baseline: the one the paper pairs it with)."""
    def centralised(row):
        backbone = row["backbone"] or SPEC.choice("method", row["method"])["compared_with"]
        return None if row["method"] == "Centralized" else {"method_group": "Centralized", "method": "Centralized",
                                                            "backbone": backbone}
    return _relative(ours, context, centralised, lambda row, ref: f"rel_change_vs_centralized_{ref['backbone']}",
                     lambda row, ref: (f"100·(mean {row['method']} {row['backbone']}".rstrip()
                                       + f" / mean Centralized {ref['backbone']} − 1), {row['protocol']}"))


def _drop_vs_full(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """Table 2: each variant against full FedKDRec on the same backbone (as the paper's parentheses)."""
    return _relative(ours, context, lambda row: None if row["method"] == "FedKDRec" else {"method": "FedKDRec"},
                     lambda row, ref: "rel_drop_vs_full",
                     lambda row, ref: f"100·(mean {row['method']} / mean FedKDRec − 1), {row['backbone']}, "
                                      f"{row['protocol']}")


def _mark_repeats(table: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """The full-ranking rows put a second reading beside the same paper value: the README status
    counts each paper cell once (:mod:`fedlib.reporting.status`)."""
    table["repeats_paper_value"] = table["protocol"] != SAMPLED
    return table


def _bytes_in_units(ours: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """Tables 3-4: the seed means of the received bytes in the row's ``unit`` (KB or MB), after the scores.

    Derived rows: the consistency check converts only fraction/percent, so their ``run_metric``
    is empty and their note says which recorded metric they come from (then the row's own note).
    """
    if ours.empty:
        return ours
    sent = ours["run_metric"] == DOWNLOAD
    factor = ours["unit"].map(BYTES_PER_UNIT).astype(float)
    ours.loc[sent, "value"] = ours["value"] / factor
    ours.loc[sent, "std"] = ours["std"] / factor
    ours.loc[sent, "ours_unit"] = ours["unit"]
    ours.loc[sent, "run_metric"] = ""
    own = ours["note"].fillna("") if "note" in ours else pd.Series("", index=ours.index)
    ours["note"] = [f"derived: mean {DOWNLOAD} / {BYTES_PER_UNIT[u]} (1 {u} = {BYTES_PER_UNIT[u]} B)"
                    + (f"; {note}" if note else "") if byte else np.nan
                    for u, note, byte in zip(ours["unit"], own, sent)]
    return pd.concat([ours[~sent], ours[sent]], ignore_index=True).drop(columns="unit")


def _scores_in_percent(table: pd.DataFrame, context: TableContext) -> pd.DataFrame:
    """Table 4: our score rows without a paper value in percent like the paper's (its bytes are in KB)."""
    unmatched = table["value_paper"].isna() & table["value_ours"].notna() & (table["unit"] == "fraction")
    for column in ("value_ours", "std_ours"):
        table.loc[unmatched, column] = table.loc[unmatched, column].astype(float) * 100.0
    table.loc[unmatched, "unit"] = "percent"
    return table


TABLE_HOOKS = {"change_vs_centralized": _change_vs_centralized, "drop_vs_full": _drop_vs_full,
               "mark_repeats": _mark_repeats, "bytes_in_units": _bytes_in_units,
               "scores_in_percent": _scores_in_percent, "statistics_units": metric_units({"Sparsity": "percent"})}


def paper_table(table_id: str, records, profile: str, datasets: Sequence[str] = OFFLINE_DATASETS,
                cell_kwargs: Mapping = {}) -> pd.DataFrame:
    """One table of the spec (``table1_main`` ... ``table5_dataset_stats``): paper vs ours, from the latest records."""
    statistics = functools.partial(grid.statistics_config, PAPER)
    builder, cell_kwargs = (statistics, {}) if table_id == "table5_dataset_stats" else (cell, cell_kwargs)
    return build_table(SPEC, table_id, records, profile, builder=builder, hooks=TABLE_HOOKS,
                       options={"datasets": list(datasets)}, cell_kwargs=dict(cell_kwargs))


#: ``tableN(records, profile, datasets=OFFLINE_DATASETS, cell_kwargs={})``: the paper's Table N
table1, table2, table3, table4, table5 = (functools.partial(paper_table, t) for t in SPEC.data["tables"])


def data_statistics_records(profile: str, datasets: Sequence[str] = OFFLINE_DATASETS, records=()) -> list:
    """Record each dataset's statistics (the split we train on) as a run, once per dataset.

    Metrics: ``users``, ``items``, ``interactions`` (train + valid + test, counts) and
    ``sparsity`` (percent: ``100·(1 − interactions / (users·items))``).
    """
    return grid.record_split_statistics(PAPER, profile, datasets, load_split, records)


def all_tables(records, profile: str, cell_kwargs: Mapping = {}, *, datasets: Sequence[str] = OFFLINE_DATASETS
               ) -> Dict[str, pd.DataFrame]:
    """Every paper table (keyed by its ``paper_tables`` file stem) -> its paper-vs-ours frame."""
    return {table: paper_table(table, records, profile, datasets, cell_kwargs) for table in SPEC.data["tables"]}


def write_tables(profile: str, cell_kwargs: Mapping = {}, *, datasets: Sequence[str] = OFFLINE_DATASETS
                 ) -> Dict[str, pd.DataFrame]:
    """Record the data statistics if needed, build every table and write ``results/fedkdrec[/profile]/``."""
    measured = [d for d in datasets if d in OFFLINE_DATASETS or d == "synthetic"]
    return grid.write_tables(PAPER, profile, lambda records: all_tables(records, profile, cell_kwargs, datasets=datasets),
                             lambda records: data_statistics_records(profile, measured, records),
                             flag_rules=flag_rules())


# ======================================================================================
# The paper's claims, checked on our numbers
# ======================================================================================
def _by_id(tables: Mapping[str, pd.DataFrame]) -> Dict[str, pd.DataFrame]:
    """Tables keyed by their short id (``table1``), whatever key the caller used."""
    out = {}
    for key, frame in tables.items():
        out[str(frame["table"].iloc[0]) if len(frame) else key.split("_", 1)[0]] = frame
    return out


def _value(frame: Optional[pd.DataFrame], column: str = "value_ours", **keys) -> float:
    if frame is None or frame.empty:
        return math.nan
    mask = np.ones(len(frame), dtype=bool)
    for k, v in keys.items():
        mask &= (frame[k].astype(str) == str(v)).to_numpy()
    values = frame.loc[mask, column].dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def _holds(a: float, b: float):
    return bool(a > b) if math.isfinite(a) and math.isfinite(b) else np.nan


def _above_all(value: float, others: Mapping[str, float]):
    """``value`` above every one of ``others``: False as soon as one recorded is not below it,
    True only when all are recorded and below, NaN otherwise (undecided)."""
    found = {k: v for k, v in others.items() if math.isfinite(v)}
    if not math.isfinite(value) or not found:
        return np.nan
    if any(not v < value for v in found.values()):
        return False
    return True if len(found) == len(others) else np.nan


def _stats(frame: Optional[pd.DataFrame], **keys) -> tuple:
    """``(seed mean, sample std, number of seeds)`` of one table row (NaN, NaN, 0 when missing)."""
    n = _value(frame, "n_seeds", **keys)
    return (_value(frame, **keys), _value(frame, "std_ours", **keys), int(n) if math.isfinite(n) else 0)


def claims(tables: Mapping[str, pd.DataFrame], protocol: str = SAMPLED) -> pd.DataFrame:
    """The paper's headline statements checked on our numbers (from :func:`all_tables`).

    One row per claim, dataset, backbone and metric: ``holds`` is True/False, or NaN when a
    number it needs is missing (a claim about several rivals is False as soon as one
    recorded rival refutes it, True only when all are recorded); ``ours`` prints our
    numbers (percent, or bytes), ``evidence`` where they come from, what is missing and the
    paper's numbers. Scores use ``protocol`` (default: the one compared with the paper).

    * FedKDRec beats PTF-FedRec (Table 1);
    * FedKDRec beats the best parameter-transfer baseline, FedMF/FedNCF/FedPerGNN (Table 1);
    * each component helps: every Table-2 variant scores below full FedKDRec;
    * FedKDRec receives fewer bytes per client and round than FedMF (Table 3).

    ``holds`` compares seed means. ``p_welch`` says whether the gap is larger than the seed
    spread: the two-sided Welch t-test of FedKDRec against the closest rival (PTF-FedRec, the
    best baseline, the best variant) from the tables' means, ``std_ours`` and ``n_seeds``; NaN
    when either side has fewer than two seeds (or no spread at all). ``seeds`` names the counts.
    Bytes are deterministic and get no test.
    """
    t = _by_id(tables)
    t1, t2, t3 = t.get("table1"), t.get("table2"), t.get("table3")
    datasets = []
    if t1 is not None and len(t1):
        datasets = list(dict.fromkeys(t1.loc[t1["value_ours"].notna(), "dataset"]))
    datasets = datasets or [SPEC.choice("dataset", d)["paper"] for d in OFFLINE_DATASETS]
    rows = []

    def add(claim, dataset, backbone, metric, holds, ours, evidence, test=(math.nan, "")):
        rows.append({"claim": claim, "dataset": dataset, "backbone": backbone, "metric": metric, "holds": holds,
                     "p_welch": test[0], "seeds": test[1], "ours": ours, "evidence": evidence})

    for d in datasets:
        for b in BACKBONES:
            for metric in PAPER_METRICS:
                where = {"dataset": d, "metric": metric, "stat": "score", "protocol": protocol}
                kd = _value(t1, method="FedKDRec", backbone=b, **where)
                kd_paper = _value(t1, "value_paper", method="FedKDRec", backbone=b, **where)
                ptf = _value(t1, method="PTF-FedRec", backbone=b, **where)
                ptf_paper = _value(t1, "value_paper", method="PTF-FedRec", backbone=b, **where)
                kd_stats = _stats(t1, method="FedKDRec", backbone=b, **where)
                add("FedKDRec beats PTF-FedRec", d, b, metric, _holds(kd, ptf),
                    f"FedKDRec {kd:.2f} vs PTF-FedRec {ptf:.2f} (%)",
                    f"Table 1, {protocol}; paper: {kd_paper:.2f} vs {ptf_paper:.2f}",
                    welch_p(kd_stats, _stats(t1, method="PTF-FedRec", backbone=b, **where)))

                baselines = {m: _value(t1, method=m, backbone="", **where) for m in PARAMETER_BASELINES}
                found = {m: v for m, v in baselines.items() if math.isfinite(v)}
                best = max(found, key=found.get) if found else None
                missing = [m for m in PARAMETER_BASELINES if m not in found]
                add("FedKDRec beats the parameter-transfer baselines", d, b, metric, _above_all(kd, baselines),
                    f"FedKDRec {kd:.2f} vs best baseline {best} {found[best]:.2f} (%)" if best
                    else f"FedKDRec {kd:.2f}",
                    f"Table 1, {protocol}" + (f"; not recorded: {', '.join(missing)}" if missing else ""),
                    welch_p(kd_stats, _stats(t1, method=best, backbone="", **where)) if best else (math.nan, ""))

                where2 = {"dataset": d, "backbone": b, "metric": metric, "stat": "score", "protocol": protocol}
                full = _value(t2, method="FedKDRec", **where2)
                variants = {v: _value(t2, method=v, **where2) for v in TABLE2_VARIANTS if v != "FedKDRec"}
                found = {v: x for v, x in variants.items() if math.isfinite(x)}
                not_below = [v for v, x in found.items() if not x < full]
                missing = [v for v in variants if v not in found]
                best = max(found, key=found.get) if found else None
                add("each component helps (every variant below full FedKDRec)", d, b, metric,
                    _above_all(full, variants),
                    f"FedKDRec {full:.2f} vs best variant {best} {found[best]:.2f} (%)" if best
                    else f"FedKDRec {full:.2f}",
                    f"Table 2, {protocol}" + (f"; not below full: {', '.join(not_below)}" if not_below else "")
                    + (f"; not recorded: {', '.join(missing)}" if missing else ""),
                    welch_p(_stats(t2, method="FedKDRec", **where2), _stats(t2, method=best, **where2)) if best
                    else (math.nan, ""))

            where3 = {"dataset": d, "metric": COMM_METRIC}
            kd_bytes = _value(t3, method=TABLE3_FEDKDREC[b], **where3) * BYTES_PER_UNIT["KB"]
            mf_bytes = _value(t3, method="FedMF", **where3) * BYTES_PER_UNIT["MB"]
            add("FedKDRec receives fewer bytes than FedMF", d, b, "bytes received per client and round",
                _holds(mf_bytes, kd_bytes), f"{TABLE3_FEDKDREC[b]} {kd_bytes:.0f} B vs FedMF {mf_bytes:.0f} B",
                "Table 3 (binary KB/MB converted back to bytes); paper: "
                f"{_value(t3, 'value_paper', method=TABLE3_FEDKDREC[b], **where3):.3f} KB vs "
                f"{_value(t3, 'value_paper', method='FedMF', **where3):.3f} MB")
    frame = pd.DataFrame(rows, columns=["claim", "dataset", "backbone", "metric", "holds", "p_welch", "seeds", "ours",
                                        "evidence"])
    frame["holds"] = frame["holds"].astype(object)
    return frame


def component_effects(tables: Mapping[str, pd.DataFrame], metric: str = "N@10", dataset: str = "MovieLens-100K",
                      protocol: str = SAMPLED) -> pd.DataFrame:
    """Table 2 per component: how much full FedKDRec gains over each ablated variant.

    One row per (backbone, variant): ``full`` and ``variant`` seed means (percent), ``gain`` =
    full − variant (positive: the component helps), the Welch ``p_welch`` of that gap and the
    seed counts. The paper's Table 2 claims every gain is positive.
    """
    t2, rows = _by_id(tables).get("table2"), []
    for backbone in BACKBONES:
        where = {"dataset": dataset, "backbone": backbone, "metric": metric, "stat": "score", "protocol": protocol}
        full = _stats(t2, method="FedKDRec", **where)
        for variant in TABLE2_VARIANTS:
            if variant == "FedKDRec":
                continue
            other = _stats(t2, method=variant, **where)
            p, seeds = welch_p(full, other)
            rows.append({"backbone": backbone, "variant": variant, "metric": metric, "full": full[0],
                         "variant_value": other[0], "gain": full[0] - other[0], "p_welch": p, "seeds": seeds})
    return pd.DataFrame(rows, columns=["backbone", "variant", "metric", "full", "variant_value", "gain", "p_welch",
                                       "seeds"])


def claims_verdict(frame: pd.DataFrame, metric: str = "N@10", dataset: str = "MovieLens-100K",
                   alpha: float = 0.05) -> pd.DataFrame:
    """:func:`claims` as one row per claim and one column per backbone, in words.

    A cell reads ``holds`` / ``fails`` / ``undecided`` (a number is missing), then whether the gap
    to the closest rival is ``beyond`` or ``within seed noise`` (Welch p < ``alpha`` or not) with
    the p-value and seed counts. The byte claim is deterministic and gets no test. Score claims
    are read at ``metric``.
    """
    rows = frame[(frame["dataset"] == dataset)
                 & ((frame["metric"] == metric) | ~frame["metric"].isin(PAPER_METRICS))]

    def words(row) -> str:
        if pd.isna(row["holds"]):
            return "undecided"
        text = "holds" if row["holds"] else "fails"
        if math.isfinite(row["p_welch"]):
            text += ", " + describe_p(row["p_welch"], row["seeds"], alpha)
        return text

    table = rows.assign(verdict=rows.apply(words, axis=1)).pivot_table(
        index="claim", columns="backbone", values="verdict", aggfunc="first", sort=False)
    return table.reindex(columns=[b for b in BACKBONES if b in table.columns])
