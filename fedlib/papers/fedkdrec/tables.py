"""FedKDRec: from recorded runs to the paper's Tables 1–5 (paper vs ours) and its claims.

Every number is read from ``runs.jsonl`` records written by
:func:`fedlib.papers.fedkdrec.experiment.run_grid` or :func:`~fedlib.papers.fedkdrec.experiment.run_cells`,
matched to table cells by the configuration hash of :func:`fedlib.papers.fedkdrec.experiment.cell`
(with every recorded seed; ours are seed means, ``std_ours`` the sample standard deviation).

**Protocol mapping.** The paper prints H@10 and N@10 on a 0–100 scale without saying how it
ranks. Each run records both of our protocols, so Tables 1 and 2 carry a ``protocol`` key:

* ``protocol = "sampled 1+99"``: ``sampled/HR@10`` → H@10 and ``sampled/NDCG@10`` → N@10
  (the held-out item ranked against 99 sampled negatives). These are the rows compared
  with the paper: their scale matches the paper's (H@10 around 60 % on ML-100K).
* ``protocol = "full ranking"``: ``full/Recall@10`` → H@10 (one test item per user, so
  Recall@10 equals HR@10) and ``full/NDCG@10`` → N@10, ranked against every item the user
  has not trained on. The paper value is repeated on these rows so that the two scales
  can be read side by side; the gap shows which protocol the paper's numbers fit.

Scores are fractions in ``runs.jsonl`` and percent in the tables (``unit = percent``).

The tables (file names are the paper's table ids, ``results/fedkdrec[/profile]/table1.csv`` ...):

* **Table 1** (:func:`table1`): Centralized, FedMF, FedNCF, FedPerGNN, PTF-FedRec and
  FedKDRec, per backbone, ``stat = "score"``; the paper's ``rel_change_vs_centralized_<B>``
  rows are derived from our means, ``100·(method / Centralized(B) − 1)`` (FedMF is compared
  with NeuMF, FedNCF with NeuNCF, FedPerGNN with LightGCN, as in the paper).
* **Table 2** (:func:`table2`): the component ablations (``-m``, ``-c``, ``-s``, ``~s``,
  ``-m-c~s`` = PTF-FedRec) per backbone, with ``rel_drop_vs_full = 100·(variant / FedKDRec − 1)``.
* **Table 3** (:func:`table3`): the average bytes a client *receives* per round
  (``download_bytes_per_client_round``), in the paper's units with binary multiples
  (1 KB = 1024 B, 1 MB = 1024² B; :mod:`fedlib.engine.communication`): MB for the
  parameter-transfer methods, KB for the prediction-transfer ones.
* **Table 4** (:func:`table4`): the agent ablations on NeuNCF: sampled N@10/H@10 (percent)
  and ``Comm. (KB)`` from the received bytes.
* **Table 5** (:func:`table5`): dataset statistics measured on the split we train on,
  recorded as runs by :func:`data_statistics_records` so that every value has a run record.

Derived cells (relative changes, unit conversions of bytes) carry the ids of the runs they
are computed from, an empty ``run_metric`` and a note saying how they are derived. Paper
cells of the datasets not available offline (ML-1M, Amazon Industrial) keep the paper
value, an empty ``value_ours`` and the note :data:`~fedlib.reporting.NEEDS_DOWNLOAD_NOTE`.

:func:`claims` checks the paper's headline statements on our numbers. Figures 2–4 and the
learning curves are in :mod:`fedlib.papers.fedkdrec.figures`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from fedlib.experiments import grid
from fedlib.papers.fedkdrec.clients import VARIANTS
from fedlib.papers.fedkdrec.experiment import (BACKBONES, OFFLINE_DATASETS, PAPER, PARAMETER_BASELINE_REFERENCE,
                                               TABLE2_VARIANTS, TABLE4_VARIANTS, cell, load_split)
from fedlib.reporting import NEEDS_DOWNLOAD_NOTE, aggregate_runs, compare_with_paper, load_paper_table
from fedlib.reporting.stats import describe_p, welch_p
from fedlib.reporting.results import RUN_ID_SEPARATOR, config_hash
from fedlib.reporting.results import cell_index as _index

__all__ = ["PAPER_DATASETS", "SAMPLED", "FULL", "PROTOCOLS", "METRICS", "BYTES_PER_UNIT", "data_statistics_records",
           "table1", "table2", "table3", "table4", "table5", "all_tables", "write_tables", "claims", "claims_verdict", "component_effects"]

#: our dataset keys -> the paper's names in Tables 1–4 ...
PAPER_DATASETS = {"ML-100K": "MovieLens-100K", "ML-1M": "MovieLens-1M", "Industrial": "Amazon Industrial"}
#: ... and in Table 5
STATS_DATASETS = {"ML-100K": "ML100K", "ML-1M": "ML1M", "Industrial": "Industrial"}
_OFFLINE_NAMES = {PAPER_DATASETS[d] for d in OFFLINE_DATASETS} | {STATS_DATASETS[d] for d in OFFLINE_DATASETS}

SAMPLED = "sampled 1+99"
FULL = "full ranking"
PROTOCOLS = (SAMPLED, FULL)
#: our metric -> (the paper's metric, protocol)
METRICS = {"sampled/NDCG@10": ("N@10", SAMPLED), "sampled/HR@10": ("H@10", SAMPLED),
           "full/NDCG@10": ("N@10", FULL), "full/Recall@10": ("H@10", FULL)}
PAPER_METRICS = ("N@10", "H@10")

PARAMETER_BASELINES = ("FedMF", "FedNCF", "FedPerGNN")
METHOD_GROUPS = {"Centralized": "Centralized", "FedMF": "Parameter-transfer FR", "FedNCF": "Parameter-transfer FR",
                 "FedPerGNN": "Parameter-transfer FR", "PTF-FedRec": "PTF-FedRec", "FedKDRec": "FedKDRec"}

DOWNLOAD = "download_bytes_per_client_round"
COMM_METRIC = "avg per-client communication cost per round (client receive phase)"
#: binary multiples, as the paper's Table 3 (0.205 MB = 215,296 B / 1024²)
BYTES_PER_UNIT = {"B": 1, "KB": 1024, "MB": 1024 ** 2}
#: Table 3's row label of FedKDRec per backbone ("NeuCF" is how the paper prints NeuNCF there)
TABLE3_FEDKDREC = {"NeuMF": "FedKDRec(NeuMF)", "NeuNCF": "FedKDRec(NeuCF)", "LightGCN": "FedKDRec(LightGCN)"}
#: Table 4's row labels and groups: teacher-feature ablations act on the clients-to-server
#: direction, transfer-reward ablations on server-to-clients
TABLE4_LABELS = {v: ("FedKDRec (full)" if v == "FedKDRec" else v) for v in TABLE4_VARIANTS}
TABLE4_SETTINGS = {v: ("FedKDRec" if v == "FedKDRec" else
                       "Clients-to-server" if "teacher_features" in VARIANTS[v] else "Server-to-clients")
                   for v in TABLE4_VARIANTS}
DERIVED = "derived"


# ======================================================================================
# Matching runs to cells
# ======================================================================================
def _paper_dataset(dataset: str) -> str:
    return PAPER_DATASETS.get(dataset, dataset)


def _missing_note(row: pd.Series) -> str:
    if str(row.get("dataset", "")) not in _OFFLINE_NAMES:
        return NEEDS_DOWNLOAD_NOTE
    return "not run at this profile"


def _score_cells(protocols: Sequence[str] = PROTOCOLS, with_protocol: bool = True):
    def metric_cells(name: str) -> Optional[dict]:
        if name not in METRICS or METRICS[name][1] not in protocols:
            return None
        metric, protocol = METRICS[name]
        return {"metric": metric, "protocol": protocol} if with_protocol else {"metric": metric}
    return metric_cells


def _scores(records, index, protocols: Sequence[str] = PROTOCOLS, with_protocol: bool = True) -> pd.DataFrame:
    ours = aggregate_runs(records, lambda r: index.get(r.config_hash),
                          metric_cells=_score_cells(protocols, with_protocol))
    if len(ours) and with_protocol:
        recall = "full ranking: full/Recall@10 as H@10 (one test item per user: Recall@10 = HR@10)"
        ours["note"] = np.where(ours["protocol"] == FULL,
                                np.where(ours["metric"] == "H@10", recall, "full ranking: full/NDCG@10"), "")
    return ours


def _bytes(records, index, metric: Optional[str] = None) -> pd.DataFrame:
    """Seed means of the received bytes per client and round, converted to KB or MB (derived rows).

    The unit is the paper's convention for the method (``keys["unit"]``): MB for the
    parameter-transfer methods, KB for the prediction-transfer ones. The consistency check
    converts only fraction/percent, so these rows have an empty ``run_metric`` and say in
    their note which recorded metric they come from.
    """
    keys = {"metric": metric} if metric else {}  # Table 3's cells carry their metric already
    ours = aggregate_runs(records, lambda r: index.get(r.config_hash),
                          metric_cells=lambda name: keys if name == DOWNLOAD else None)
    if ours.empty:
        return ours
    factor = ours["unit"].map(BYTES_PER_UNIT).astype(float)
    ours["value"] = ours["value"] / factor
    ours["std"] = ours["std"] / factor
    ours["ours_unit"] = ours["unit"]
    ours["run_metric"] = ""
    ours["note"] = [f"{DERIVED}: mean {DOWNLOAD} / {BYTES_PER_UNIT[u]} (1 {u} = {BYTES_PER_UNIT[u]} B)"
                    + (f"; {extra}" if extra else "") for u, extra in zip(ours["unit"], ours["extra_note"])]
    return ours.drop(columns=["unit", "extra_note"])


def _derived(keys: Mapping[str, Any], value: float, run_ids: Sequence[str], note: str, unit: str = "percent",
             sources: Sequence[Mapping[str, Any]] = ()) -> dict:
    """A derived cell; ``sources`` (rows of ours) lend it their commits and devices."""
    provenance = {column: RUN_ID_SEPARATOR.join(sorted({part for row in sources for part in
                                                         str(row.get(column) or "").split(RUN_ID_SEPARATOR) if part}))
                  for column in ("commit", "device")}
    return {**keys, "value": float(value), "n_seeds": len(run_ids), "run_ids": RUN_ID_SEPARATOR.join(run_ids),
            "run_metric": "", "ours_unit": unit, "note": f"{DERIVED}: {note}", **provenance}


def _ids(row) -> List[str]:
    return [h for h in str(row["run_ids"]).split(RUN_ID_SEPARATOR) if h]


def _relative(ours: pd.DataFrame, keys: Sequence[str], reference_of, stat_of, note_of) -> pd.DataFrame:
    """Derived ``100·(value / reference − 1)`` rows (percent), one per row of ``ours`` with a reference.

    ``reference_of(row)`` gives the key values that differ in the reference row (or
    ``None``: no derived row); ``stat_of`` and ``note_of`` take ``(row, reference)``. The
    derived row carries the run ids of both, so the consistency check can find every run.
    """
    if ours.empty:
        return pd.DataFrame()
    lookup = {tuple(str(r[k]) for k in keys): r for _, r in ours.iterrows()}
    rows = []
    for _, row in ours.iterrows():
        target = reference_of(row)
        if target is None:
            continue
        reference = lookup.get(tuple(str(target.get(k, row[k])) for k in keys))
        if reference is None or not reference["value"] > 0 or not math.isfinite(row["value"]):
            continue
        rows.append(_derived({**{k: row[k] for k in keys}, "stat": stat_of(row, reference)},
                             100.0 * (row["value"] / reference["value"] - 1.0), _ids(row) + _ids(reference),
                             note_of(row, reference), sources=(row, reference)))
    return pd.DataFrame(rows)


def _compare(ours: pd.DataFrame, table_id: str, keys: Sequence[str], profile: str,
             protocols: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`compare_with_paper` against ``paper_tables/fedkdrec/<table_id>``.

    With ``protocols`` the paper's rows are repeated once per protocol (the same paper
    value is compared with each of ours). Our cells without a paper counterpart (e.g. the
    synthetic smoke dataset) are kept, their scores shown in percent like the paper's.
    """
    paper = load_paper_table(PAPER, table_id)
    if protocols:
        paper = pd.concat([paper.assign(protocol=p) for p in protocols], ignore_index=True)
    if ours.empty:
        ours = pd.DataFrame(columns=[*keys, "value"])
    out = compare_with_paper(ours, paper, list(keys), profile=profile, missing_note=_missing_note, unmatched="keep")
    if protocols:
        # the full-ranking rows put a second reading next to the same paper value: the README
        # status counts each paper cell once (fedlib.reporting.status)
        out["repeats_paper_value"] = out["protocol"] != SAMPLED
    unmatched = out["value_paper"].isna() & out["value_ours"].notna() & (out["unit"] == "fraction")
    for column in ("value_ours", "std_ours"):
        out.loc[unmatched, column] = out.loc[unmatched, column].astype(float) * 100.0
    out.loc[unmatched, "unit"] = "percent"
    return out


# ======================================================================================
# Table 1: main comparison (+ relative change vs centralised), both protocols
# ======================================================================================
TABLE1_KEYS = ["dataset", "method_group", "backbone", "method", "metric", "stat", "protocol"]


def _table1_pairs(datasets: Sequence[str], cell_kwargs: Mapping) -> List[tuple]:
    pairs = []
    for d in datasets:
        base = {"dataset": _paper_dataset(d), "stat": "score"}
        for m in PARAMETER_BASELINES:
            pairs.append(({**base, "method_group": METHOD_GROUPS[m], "backbone": "", "method": m},
                          cell(d, m, **cell_kwargs)))
        for b in BACKBONES:
            for m in ("Centralized", "PTF-FedRec", "FedKDRec"):
                pairs.append(({**base, "method_group": METHOD_GROUPS[m], "backbone": b, "method": m},
                              cell(d, m, backbone=b, **cell_kwargs)))
    return pairs


def table1(records, profile: str, datasets: Sequence[str] = OFFLINE_DATASETS, cell_kwargs: Mapping = {}
           ) -> pd.DataFrame:
    """Table 1: N@10 and H@10 (percent, seed means) of every method, under both protocols.

    ``stat = "score"`` rows are our means; ``stat = "rel_change_vs_centralized_<B>"`` rows
    are ``100·(method / Centralized(B) − 1)`` of those means (percent), with B the method's
    backbone, or for a parameter-transfer baseline the backbone the paper compares it with.
    """
    ours = _scores(records, _index(records, _table1_pairs(datasets, dict(cell_kwargs))))

    def centralised(row):
        if row["method"] == "Centralized":
            return None
        return {"method_group": "Centralized", "method": "Centralized",
                "backbone": row["backbone"] or PARAMETER_BASELINE_REFERENCE[row["method"]]}

    derived = _relative(
        ours, [k for k in TABLE1_KEYS if k != "stat"], centralised,
        lambda row, ref: f"rel_change_vs_centralized_{ref['backbone']}",
        lambda row, ref: (f"100·(mean {row['method']} {row['backbone']}".rstrip()
                          + f" / mean Centralized {ref['backbone']} − 1), {row['protocol']}"))
    ours = pd.concat([ours, derived], ignore_index=True) if len(derived) else ours
    return _compare(ours, "table1_main", TABLE1_KEYS, profile, protocols=PROTOCOLS)


# ======================================================================================
# Table 2: component ablations, both protocols
# ======================================================================================
TABLE2_KEYS = ["dataset", "backbone", "method", "metric", "stat", "protocol"]


def table2(records, profile: str, datasets: Sequence[str] = OFFLINE_DATASETS, cell_kwargs: Mapping = {}
           ) -> pd.DataFrame:
    """Table 2: FedKDRec and its variants per backbone (percent); ``rel_drop_vs_full`` derived.

    ``rel_drop_vs_full = 100·(variant / FedKDRec − 1)`` of the seed means (negative when
    the variant is worse), as the paper prints it in parentheses.
    """
    pairs = [({"dataset": _paper_dataset(d), "backbone": b, "method": v, "stat": "score"},
              cell(d, "FedKDRec", backbone=b, variant=v, **cell_kwargs))
             for d in datasets for b in BACKBONES for v in TABLE2_VARIANTS]
    ours = _scores(records, _index(records, pairs))
    derived = _relative(
        ours, [k for k in TABLE2_KEYS if k != "stat"],
        lambda row: None if row["method"] == "FedKDRec" else {"method": "FedKDRec"},
        lambda row, ref: "rel_drop_vs_full",
        lambda row, ref: f"100·(mean {row['method']} / mean FedKDRec − 1), {row['backbone']}, {row['protocol']}")
    ours = pd.concat([ours, derived], ignore_index=True) if len(derived) else ours
    return _compare(ours, "table2_ablation", TABLE2_KEYS, profile, protocols=PROTOCOLS)


# ======================================================================================
# Table 3: communication (bytes received per client and round)
# ======================================================================================
def _table3_pairs(datasets: Sequence[str], cell_kwargs: Mapping) -> List[tuple]:
    pairs = []
    for d in datasets:
        base = {"dataset": _paper_dataset(d), "metric": COMM_METRIC}
        for m in PARAMETER_BASELINES:
            pairs.append(({**base, "method": m, "unit": "MB", "extra_note": ""}, cell(d, m, **cell_kwargs)))
        for b in BACKBONES:
            # the paper prints one PTF-FedRec row (its transfer does not depend on the
            # backbone); ours on NeuMF is compared with it, the other backbones are extra rows
            label, note = (("PTF-FedRec", "PTF-FedRec with the NeuMF backbone (the paper prints one PTF-FedRec row)")
                           if b == "NeuMF" else (f"PTF-FedRec({b})", "not in the paper's table"))
            pairs.append(({**base, "method": label, "unit": "KB", "extra_note": note},
                          cell(d, "PTF-FedRec", backbone=b, **cell_kwargs)))
            pairs.append(({**base, "method": TABLE3_FEDKDREC[b], "unit": "KB",
                           "extra_note": "the paper's NeuCF is our NeuNCF" if b == "NeuNCF" else ""},
                          cell(d, "FedKDRec", backbone=b, **cell_kwargs)))
    return pairs


def table3(records, profile: str, datasets: Sequence[str] = OFFLINE_DATASETS, cell_kwargs: Mapping = {}
           ) -> pd.DataFrame:
    """Table 3: mean bytes received per client and round, in MB (parameter transfer) or KB (predictions).

    Binary multiples: 1 KB = 1024 B, 1 MB = 1024² B (the paper's FedMF on ML-100K,
    0.205 MB, is 1,682 items × 32 × 4 B = 215,296 B / 1024²).
    """
    ours = _bytes(records, _index(records, _table3_pairs(datasets, dict(cell_kwargs))))
    return _compare(ours, "table3_comm_cost", ["dataset", "method", "metric"], profile)


# ======================================================================================
# Table 4: agent ablations (NeuNCF)
# ======================================================================================
TABLE4_KEYS = ["dataset", "backbone", "method", "setting", "metric"]


def table4(records, profile: str, datasets: Sequence[str] = OFFLINE_DATASETS, cell_kwargs: Mapping = {}
           ) -> pd.DataFrame:
    """Table 4: the agent-design ablations on NeuNCF: sampled N@10, H@10 (percent) and Comm. (KB).

    The paper prints no communication for the clients-to-server (teacher-feature)
    ablations; ours are kept as extra rows without a paper value.
    """
    score_pairs, byte_pairs = [], []
    for d in datasets:
        for v in TABLE4_VARIANTS:
            keys = {"dataset": _paper_dataset(d), "backbone": "NeuNCF", "method": TABLE4_LABELS[v],
                    "setting": TABLE4_SETTINGS[v]}
            config = cell(d, "FedKDRec", backbone="NeuNCF", variant=v, **cell_kwargs)
            score_pairs.append((keys, config))
            byte_pairs.append(({**keys, "unit": "KB", "extra_note": "" if TABLE4_SETTINGS[v] != "Clients-to-server"
                                else "the paper prints a dash here"}, config))
    scores = _scores(records, _index(records, score_pairs), protocols=(SAMPLED,), with_protocol=False)
    comm = _bytes(records, _index(records, byte_pairs), metric="Comm. (KB)")
    ours = pd.concat([f for f in (scores, comm) if len(f)], ignore_index=True) if len(scores) or len(comm) else scores
    return _compare(ours, "table4_agent_ablation", TABLE4_KEYS, profile)


# ======================================================================================
# Table 5: dataset statistics
# ======================================================================================
STATISTICS = {"users": "# Users", "items": "# Items", "interactions": "# Interactions", "sparsity": "Sparsity"}


def _statistics_config(dataset: str) -> dict:
    return grid.statistics_config(PAPER, dataset)


def data_statistics_records(profile: str, datasets: Sequence[str] = OFFLINE_DATASETS, records=()) -> list:
    """Record each dataset's statistics (the split we train on) as a run, once per dataset.

    Metrics: ``users``, ``items``, ``interactions`` (train + valid + test, counts) and
    ``sparsity`` (percent: ``100·(1 − interactions / (users·items))``).
    """
    return grid.record_split_statistics(PAPER, profile, datasets, load_split, records)


def table5(records, profile: str) -> pd.DataFrame:
    """Table 5: #users, #items, #interactions (counts) and sparsity (percent) per dataset."""
    index = {config_hash(_statistics_config(d)): {"dataset": STATS_DATASETS.get(d, d), "method": ""}
             for d in [*STATS_DATASETS, "synthetic"]}
    ours = aggregate_runs(records, lambda r: index.get(r.config_hash),
                          metric_cells=lambda name: {"metric": STATISTICS[name]} if name in STATISTICS else None)
    if len(ours):
        ours["ours_unit"] = ["percent" if m == "Sparsity" else "count" for m in ours["metric"]]
    return _compare(ours, "table5_dataset_stats", ["dataset", "method", "metric"], profile)


# ======================================================================================
# Everything
# ======================================================================================
def all_tables(records, profile: str, cell_kwargs: Mapping = {}, *, datasets: Sequence[str] = OFFLINE_DATASETS
               ) -> Dict[str, pd.DataFrame]:
    """Every paper table (keyed by its ``paper_tables`` file stem) -> its paper-vs-ours frame."""
    return {"table1_main": table1(records, profile, datasets, cell_kwargs),
            "table2_ablation": table2(records, profile, datasets, cell_kwargs),
            "table3_comm_cost": table3(records, profile, datasets, cell_kwargs),
            "table4_agent_ablation": table4(records, profile, datasets, cell_kwargs),
            "table5_dataset_stats": table5(records, profile)}


def write_tables(profile: str, cell_kwargs: Mapping = {}, *, datasets: Sequence[str] = OFFLINE_DATASETS
                 ) -> Dict[str, pd.DataFrame]:
    """Record the data statistics if needed, build every table and write ``results/fedkdrec[/profile]/``."""
    from fedlib.reporting import read_runs, write_results_table

    records = read_runs(PAPER, profile)
    data_statistics_records(profile, [d for d in datasets if d in OFFLINE_DATASETS or d == "synthetic"], records)
    records = read_runs(PAPER, profile)
    tables = all_tables(records, profile, cell_kwargs, datasets=datasets)
    for table_id, frame in tables.items():
        # files are named by the paper's table id (``table1.csv``), as the status table expects
        write_results_table(PAPER, str(frame["table"].iloc[0]) if len(frame) else table_id, frame, profile)
    return tables


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
    datasets = datasets or [PAPER_DATASETS[d] for d in OFFLINE_DATASETS]
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
