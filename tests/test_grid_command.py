"""``python -m fedlib grid <paper> ...``: one command for every paper's resumable grid."""
from __future__ import annotations

import pytest

from fedlib.cli import main as cli_main
from fedlib.papers import GRID_COMMANDS, grid_command
from fedlib.experiments.grid import pending_cells, unique_cells
from fedlib.paths import PAPER_SLUGS


def test_every_paper_has_a_grid_command():
    assert set(GRID_COMMANDS) == set(PAPER_SLUGS)
    with pytest.raises(ValueError, match="no grid for paper 'fedxyz'"):
        grid_command("fedxyz")


def test_an_unknown_paper_is_refused_with_the_known_ones(capsys):
    assert cli_main(["grid", "fedxyz", "table1"]) == 2
    assert "papers with a grid are fedrkg, f3crec" in capsys.readouterr().err


@pytest.mark.parametrize("paper, part", [("f3crec", "table2"), ("fedcsr", "table2"), ("fedkdrec", "table1")])
def test_pending_lists_what_is_left_and_trains_nothing(capsys, paper, part):
    from importlib import import_module

    module = import_module(f"fedlib.papers.{paper}.experiment")
    expected = pending_cells(paper, "paper", module.grid_cells(part))
    assert cli_main(["grid", paper, part, "--pending"]) == 0
    printed = capsys.readouterr().out
    assert f"{len(expected)} of {len(unique_cells(module.grid_cells(part)))} cells pending" in printed


def test_f3crec_filters_by_backbone_and_method(capsys):
    cli_main(["grid", "f3crec", "table2", "--datasets", "ML-100K", "--backbones", "FedMF", "--methods", "FT", "KD",
              "--pending"])
    printed = capsys.readouterr().out
    assert " of 2 cells pending" in printed  # one dataset x one backbone x two methods
