"""``data stats``: comparison table, CSV output, CLI wiring, error paths."""
from __future__ import annotations

import argparse
import io
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pandas as pd

from fedlib.data.stats import add_stats_command, main, stats_table


def test_f3crec_ml100k_matches_the_paper(shared_data):
    table = stats_table("ml-100k", "f3crec", root=shared_data)
    assert list(table.columns) == ["block", "statistic", "ours", "paper", "delta"]
    assert len(table) == 16 and table["paper"].notna().all()
    assert (table["delta"] == 0).all()
    wide = stats_table("ml-100k", "f3crec", root=shared_data, compare=False)
    assert list(wide.columns) == ["block", "users", "items", "interactions", "sparsity"]


def test_delta_is_ours_minus_paper(shared_data):
    table = stats_table("hetrec2011-lastfm-2k", "f3crec", root=shared_data)
    assert np.allclose(table["delta"], table["ours"] - table["paper"])
    assert (table["delta"] != 0).any()


def test_fedcsr_and_fedpcl_rows(shared_data):
    csr = stats_table("c2dsr-movie-book", "fedcsr", root=shared_data, num_negatives=10)
    items = csr[csr["statistic"].str.startswith("items_")]
    assert items["statistic"].tolist() == ["items_Movie", "items_Book"] and (items["delta"] == 0).all()
    pcl = stats_table("amazon-cdr-disencdr", "fedpcl_cdr", root=shared_data, variant="phone_sport")
    overlap = pcl[pcl["statistic"] == "overlapping_users"]
    assert overlap["paper"].tolist() == [655.0, 655.0]  # Task 1 is the Phone-Sport pair


def test_csv_output_and_standalone_main(shared_data):
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["ml-latest-small", "--protocol", "f3crec", "--format", "csv", "--data-root", str(shared_data)])
    assert code == 0
    table = pd.read_csv(io.StringIO(out.getvalue()))
    assert (table["delta"] == 0).all() and len(table) == 16


def test_subcommand_registration(shared_data):
    parser = argparse.ArgumentParser(prog="fedlib data")
    sub = parser.add_subparsers(dest="command")
    add_stats_command(sub)
    args = parser.parse_args(["stats", "amazon-video", "--protocol", "fedrkg", "--data-root", str(shared_data)])
    out = io.StringIO()
    with redirect_stdout(out):
        assert args.func(args) == 0
    assert "ours vs paper" in out.getvalue() and "amazon-video under protocol fedrkg" in out.getvalue()


def test_errors_are_reported_not_raised(shared_data, monkeypatch):
    monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["ml-100k", "--protocol", "f3c", "--data-root", str(shared_data)]) == 2
    assert "Known protocols" in err.getvalue()
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["hetrec2011-movielens-2k", "--protocol", "f3crec", "--data-root", str(shared_data)]) == 2
    assert "user_ratedmovies" in err.getvalue()
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["c2dsr-food-kitchen", "--protocol", "f3crec", "--data-root", str(shared_data)]) == 2
    assert "cannot use dataset" in err.getvalue()
