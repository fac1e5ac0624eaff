"""Paper-vs-ours tables, results files, resumable grids and figures.

The pieces a paper notebook uses, in the order it uses them:

* :func:`load_paper_table` - the paper's reported numbers (``paper_tables/<paper>/``);
* :class:`ResultCache` - a resumable grid of training runs, cached per configuration;
* :func:`append_run` - one line per finished run in ``results/<paper>/runs.jsonl``;
* :func:`aggregate_runs`, :func:`compare_with_paper` - ours next to the paper's, with deltas;
* :func:`write_results_table`, :func:`recorded_or_none` - the committed results tables;
* :func:`paper_vs_ours` - the display, live and recorded numbers clearly labelled;
* :func:`recorded_table`, :func:`with_flags`, :func:`recorded_deviations`,
  :func:`deviations_by_reason` - the lessons' flags and deviations, the same in every paper;
* :func:`save_figure`, :func:`use_style` - figures under ``figures/<paper>/``;
* :func:`check_results_dir`, :func:`render_status_markdown` - consistency and README status.
"""
from __future__ import annotations

from fedlib.data.paper_tables import list_paper_tables, load_paper_table, paper_key_columns
from fedlib.reporting.cache import ResultCache
from fedlib.reporting.consistency import check_results_dir, check_results_table
from fedlib.reporting.display import comparison_long, deviations, paper_grid, paper_vs_ours
from fedlib.reporting.results import (
    NEEDS_DOWNLOAD_NOTE,
    REQUIRED_COLUMNS,
    STANDARD_COLUMNS,
    RunRecord,
    aggregate_runs,
    append_run,
    compare_with_paper,
    config_hash,
    current_commit,
    read_runs,
)
from fedlib.reporting.flags import FlagRules
from fedlib.reporting.recorded import FLAG_ORDER, deviations_by_reason, recorded_deviations, recorded_table, with_flags
from fedlib.reporting.results_tables import read_results_table, recorded_or_none, write_results_table
from fedlib.reporting.status import render_status_markdown, update_readme

__all__ = [
    "FLAG_ORDER",
    "NEEDS_DOWNLOAD_NOTE",
    "REQUIRED_COLUMNS",
    "STANDARD_COLUMNS",
    "ResultCache",
    "RunRecord",
    "aggregate_runs",
    "append_run",
    "check_results_dir",
    "check_results_table",
    "compare_with_paper",
    "comparison_long",
    "config_hash",
    "current_commit",
    "list_paper_tables",
    "load_paper_table",
    "paper_key_columns",
    "paper_vs_ours",
    "paper_grid",
    "deviations",
    "deviations_by_reason",
    "recorded_deviations",
    "recorded_table",
    "with_flags",
    "FlagRules",
    "read_results_table",
    "read_runs",
    "recorded_or_none",
    "render_status_markdown",
    "save_figure",
    "update_readme",
    "use_style",
    "write_results_table",
]


def __getattr__(name: str):
    # Figures pull in matplotlib; load them only when a notebook asks for them, so that
    # `python -m fedlib status` and the consistency test stay light.
    if name in ("save_figure", "use_style"):
        from fedlib.reporting import figures

        return getattr(figures, name)
    raise AttributeError(f"module 'fedlib.reporting' has no attribute {name!r}")
