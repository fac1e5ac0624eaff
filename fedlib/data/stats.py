"""A paper's dataset-statistics table computed from the data, beside the paper's own values.

Usage::

    python -m fedlib data stats ml-100k --protocol f3crec
    python -m fedlib data stats hetrec2011-lastfm-2k --protocol fedrkg --format csv
    python -m fedlib.data.stats c2dsr-food-kitchen --protocol fedcsr        # standalone

The table is long: one row per statistic (and per block or domain), with the columns
``ours`` (computed by the protocol), ``paper`` (from ``paper_tables/<paper>/``, empty where
the paper has no such cell) and ``delta = ours - paper``. Percentages (sparsity, density)
are rounded as the paper prints them, so ``delta == 0`` means "prints the same".
"""
from __future__ import annotations

import argparse
import inspect
import math
import sys
from typing import Optional

import pandas as pd

from fedlib.data.paper_tables import load_paper_table
from fedlib.data.protocols import get_protocol

# Our statistic name -> the paper table's metric name, per protocol, and the table id.
_PAPER_TABLE = {
    "f3crec": ("table1", {"users": "# of accumulated users", "items": "# of accumulated items",
                          "interactions": "# of interactions", "sparsity": "sparsity"}),
    "fedrkg": ("tableC1", {"users": "#users", "items": "#items", "interactions": "#interactions",
                           "sparsity": "sparsity"}),
    "fedkdrec": ("table5", {"users": "# Users", "items": "# Items", "interactions": "# Interactions",
                            "sparsity": "Sparsity"}),
    "fedpcl_cdr": ("table1", {"users": "# Users", "items": "# Items", "overlapping_users": "# Overlapping Users",
                              "interactions": "# Interactions", "density": "Density"}),
    "fedcsr": ("table1", {"users": "#Users", "train": "#Train", "valid": "#Valid", "test": "#Test",
                          "avg_len": "Avg.Len", "sparsity": "Sparsity"}),
}
_KEY_COLUMNS = ("block", "domain")


def stats_table(dataset: str, protocol: str, *, compare: bool = True, **options) -> pd.DataFrame:
    """The paper's statistics table for ``dataset`` under ``protocol``.

    Args:
        dataset: dataset id (e.g. ``"ml-100k"``).
        protocol: protocol name (e.g. ``"f3crec"``).
        compare: ``True`` -> long table with ``ours, paper, delta``; ``False`` -> the wide
            table of :func:`statistics` of the protocol (our values only).
        **options: passed to the protocol's ``build`` when it accepts them (``seed``,
            ``variant``, ``root``, ``allow_partial``, ``split``, ``overlap_ratio``, ...).

    Returns:
        A DataFrame; ``attrs["notes"]`` holds the split's provenance notes.

    Raises:
        UnknownProtocolError, UnsupportedDatasetError, and the loaders' errors
        (``MissingDataError``, ``PartialDataError``, ...) when the data are not available.
    """
    proto = get_protocol(protocol)
    accepted = inspect.signature(proto.build).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    split = proto.build(dataset, **kwargs)
    wide = proto.statistics(split)
    notes = tuple(getattr(split, "notes", ()))
    if not compare:
        wide.attrs["notes"] = notes
        return wide
    long = _compare(proto.name, dataset, wide)
    long.attrs["notes"] = notes
    long.attrs["wide"] = wide
    return long


def _compare(protocol: str, dataset: str, wide: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in _KEY_COLUMNS if c in wide.columns]
    long = wide.melt(id_vars=keys, var_name="statistic", value_name="ours")
    paper = _paper_rows(protocol, dataset)
    domains = set(wide["domain"]) if "domain" in wide.columns else set()
    long["paper"] = [_lookup(protocol, paper, row, keys, domains) for row in long.itertuples(index=False)]
    long["ours"] = long["ours"].astype(float)
    long["delta"] = (long["ours"] - long["paper"]).round(6)
    # Group the rows by block / domain (in the wide table's row order), statistics in column order.
    row_of_key = {tuple(r): i for i, r in enumerate(wide[keys].itertuples(index=False))} if keys else {}
    order_stat = {c: i for i, c in enumerate(c for c in wide.columns if c not in keys)}
    long["_row"] = [row_of_key.get(tuple(getattr(r, k) for k in keys), 0) for r in long.itertuples(index=False)]
    long["_stat"] = long["statistic"].map(order_stat)
    long = long.sort_values(["_row", "_stat"], kind="stable").reset_index(drop=True)
    return long[keys + ["statistic", "ours", "paper", "delta"]]


def _paper_rows(protocol: str, dataset: str) -> pd.DataFrame:
    """Rows of the paper's statistics table for ``dataset`` (empty frame if the paper has none)."""
    table_id, _ = _PAPER_TABLE[protocol]
    try:
        table = load_paper_table(protocol, table_id)
    except (FileNotFoundError, KeyError):
        return pd.DataFrame()
    if protocol == "fedpcl_cdr":
        return table  # substitute data: matched by domain name across the paper's tasks
    return table[table["dataset"] == get_protocol(protocol).labels.get(dataset)]


def _lookup(protocol: str, paper: pd.DataFrame, row, keys, domains: set) -> float:
    """The paper's value for one statistic row (NaN when the paper has no such cell)."""
    if paper.empty:
        return math.nan
    _, names = _PAPER_TABLE[protocol]
    statistic = row.statistic
    if protocol == "fedcsr" and statistic.startswith("items_"):
        selected = paper[(paper["metric"] == "#Items") & (paper["domain"] == statistic[len("items_"):])]
    elif statistic in names:
        selected = paper[paper["metric"] == names[statistic]]
    else:
        return math.nan
    if "block" in keys:
        selected = selected[selected["block"] == row.block]
    if protocol == "fedpcl_cdr":
        if statistic == "overlapping_users":
            # Only comparable with a task made of exactly the same domains.
            tasks = paper.groupby("task")["domain"].agg(lambda d: set(d) - {""})
            same = [task for task, ds in tasks.items() if ds == domains]
            selected = selected[selected["task"].isin(same)]
        else:
            selected = selected[selected["domain"] == row.domain]
    if selected.empty:
        return math.nan
    return float(selected["value"].iloc[0])


def format_text(table: pd.DataFrame, dataset: str, protocol: str) -> str:
    """Human-readable rendering: the table, then the provenance notes."""
    shown = table.copy()
    for column in ("ours", "paper", "delta"):
        if column in shown.columns:
            shown[column] = [_fmt(v) for v in shown[column]]
    lines = [f"{dataset} under protocol {protocol}", ""]
    wide = table.attrs.get("wide")
    if wide is not None:
        lines += ["ours:", wide.to_string(index=False), "", "ours vs paper (delta = ours - paper):"]
    lines.append(shown.to_string(index=False))
    notes = table.attrs.get("notes", ())
    if notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in notes]
    return "\n".join(lines)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if float(value).is_integer():
        return f"{int(value):d}"
    return f"{value:.6g}"


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", help="dataset id, e.g. ml-100k")
    parser.add_argument("--protocol", required=True, help="paper protocol: fedrkg, f3crec, fedkdrec, fedpcl_cdr, fedcsr")
    parser.add_argument("--format", choices=("text", "csv"), default="text", help="output format (default text)")
    parser.add_argument("--variant", default=None, help="dataset variant (default: the one matching the paper)")
    parser.add_argument("--seed", type=int, default=None, help="seed of random splits / candidates (default 0)")
    parser.add_argument("--split", choices=("random", "chronological"), default=None,
                        help="f3crec: per-user split inside blocks (default random, as the paper states)")
    parser.add_argument("--overlap-ratio", type=float, default=None, help="fedpcl_cdr: share of overlapping users kept")
    parser.add_argument("--allow-partial", action="store_true",
                        help="accept a partial copy (e.g. ml-1m offline); never for reported results")
    parser.add_argument("--data-root", default=None, help="data root (default $FEDLIB_DATA)")


def run_stats(args) -> int:
    """Entry point shared by ``python -m fedlib data stats`` and ``python -m fedlib.data.stats``."""
    from fedlib.data.errors import FedlibDataError

    try:
        table = stats_table(
            args.dataset, args.protocol,
            variant=args.variant, seed=args.seed, split=args.split, overlap_ratio=args.overlap_ratio,
            allow_partial=args.allow_partial or None, root=args.data_root,
        )
    except FedlibDataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.format == "csv":
        sys.stdout.write(table.to_csv(index=False, float_format="%.10g"))
    else:
        print(format_text(table, args.dataset, args.protocol))
    return 0


def add_stats_command(subparsers) -> argparse.ArgumentParser:
    """Register ``stats`` on the ``data`` command's subparsers (``python -m fedlib data stats``)."""
    parser = subparsers.add_parser(
        "stats",
        help="a paper's dataset statistics, ours beside the paper's",
        description=__doc__.split("\n\n", 1)[0],
    )
    _add_arguments(parser)
    parser.set_defaults(func=run_stats)
    return parser


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedlib.data.stats", description=__doc__.split("\n\n", 1)[0])
    _add_arguments(parser)
    return run_stats(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
