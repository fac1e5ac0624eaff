"""Saving figures under ``figures/<paper>/`` with stable names and reproducible bytes.

Committed figures should change in git only when the plot changes. Matplotlib stamps
files with its version and the date, and SVG element ids are random unless salted;
:func:`save_figure` strips the stamps and fixes the salt, so the same figure drawn by the
same matplotlib gives the same bytes.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from fedlib.paths import figures_dir
from fedlib.reporting._atomic import atomic_write_bytes
from fedlib.reporting.results import check_profile, check_slug

FIGURE_FORMATS = ("png", "svg", "pdf")

# None removes a key matplotlib would otherwise fill in (software version, dates).
_UNSTAMPED_METADATA = {
    "png": {"Software": None},
    "svg": {"Creator": None, "Date": None, "Format": None, "Type": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None},
}


def save_figure(
    fig: Figure,
    paper: str,
    name: str,
    profile: str,
    formats: Sequence[str] | str = ("png",),
    *,
    dpi: int = 150,
    tight: bool = True,
) -> list[Path]:
    """Save ``fig`` as ``figures_dir(paper, profile)/<name>.<format>`` for each format.

    ``name`` must be a plain file stem (letters, digits, ``_``, ``-``), e.g.
    ``"fig4_sensitivity_epsilon"``; the paper's own figure number at the front keeps the
    folder readable. Smoke runs write to ``figures/<paper>/smoke/`` (see
    :func:`fedlib.paths.figures_dir`). Each file is written atomically. Returns the paths
    in the order of ``formats``.
    """
    check_profile(profile)
    check_slug(name, "figure name")
    if isinstance(formats, str):
        formats = (formats,)
    unknown = [fmt for fmt in formats if fmt not in FIGURE_FORMATS]
    if unknown or not formats:
        raise ValueError(f"unsupported figure format(s) {unknown or formats}; choose from {FIGURE_FORMATS}")
    directory = figures_dir(paper, profile)
    paths = []
    for fmt in formats:
        buffer = io.BytesIO()
        # A fixed salt makes SVG ids depend on the content only.
        with matplotlib.rc_context({"svg.hashsalt": f"fedlib:{paper}:{name}"}):
            fig.savefig(
                buffer,
                format=fmt,
                dpi=dpi,
                metadata=_UNSTAMPED_METADATA[fmt],
                bbox_inches="tight" if tight else None,
            )
        paths.append(atomic_write_bytes(directory / f"{name}.{fmt}", buffer.getvalue()))
    return paths


def use_style(context: str = "notebook", *, font_scale: float = 1.0) -> None:
    """The common look of every notebook figure: seaborn ``whitegrid``, colour-blind palette.

    Call once near the top of a notebook. ``context`` is seaborn's (``paper``,
    ``notebook``, ``talk``, ``poster``).
    """
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette="colorblind", font_scale=font_scale)
    matplotlib.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "axes.titleweight": "bold",
            "legend.frameon": False,
        }
    )
