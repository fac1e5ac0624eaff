"""Frozen metrics of every training loop, so that replacing the loops by one trainer (issue 42)
provably moves no number.

Every method label reachable from a paper's grid (every row of every table: F3CRec's six
methods on three backbones and its ablations, FedRKG and its baselines and variants, FedKDRec
and its baselines and variants, FedPCL-CDR and every cross-domain baseline, FedCSR with its
variants, its FedProx baselines, Individual and Centralized) has a **tiny cell** here: the
smallest honest configuration that still goes through the same loop (the synthetic data of the
smoke profiles, 2-4 rounds, d = 8, one thread; ML-100K only where a path needs real side
information). More cells cover paths that a label alone does not reach (upload noise, LDP,
the guidance probe, the leak trace, the FedRAP code optimiser, the leaky sampler, test-set
selection, partial overlap, the sampled softmax, the random split, three platforms).
:func:`test_every_row_label_of_the_grid_has_a_tiny_cell` checks the coverage against each
paper's ``grid_cells``.

``tests/frozen/loop_metrics.json`` holds, per cell, its configuration, its config hash and its
metrics as computed by the code it was frozen from (``"code"``: the commit). The test rebuilds
each cell with the paper's cell builder, checks that the configuration (and so its hash) did
not change, trains it through the paper's ``run_cell`` and requires every metric to equal the
frozen value within :data:`TOLERANCE` (wall-time metrics, :func:`is_wall_time`, are not
compared); a failure names the cell, its largest deviation and the metrics that moved.

What the metrics cannot see. They are ranking metrics of a few rounds, so a change too small
to reorder any ranking passes. Cells that measure only (F3CRec's analysis, FedRKG's probe and
leak trace) equal their plain cell, as they must; ``code: prediction only`` has the flags of
``w/o SCL & MCL``. Beyond those, FedMF's F3CRec ablations (client-side terms) and FedKDRec's
reward ablations (``w/o R_i``, ``w/o R_i^s``, ``w/o R_i^l`` on NeuNCF) leave the metrics of
F3CRec / KD = FT and of FedKDRec unchanged at this size; the F3CRec ablations are therefore also
frozen on FedNCF, where every flag moves them.

Precision: float32. No paper's cell exposes a dtype (the engine's ``FederatedConfig`` has one,
but no ``run_cell`` passes it through), so the cells run in the library's default float32.

Determinism: every cell gave identical metrics twice in one process, in two processes and in
reverse order (the cells share cached splits and F3CRec's block-0 models) on one thread.

Refreezing rewrites the JSON from today's code::

    python tests/test_loop_freeze.py --refreeze [--only <cell id> ...]

Run it **only** when a change is meant to move numbers, and then bump the moved cells'
``version`` (the paper module's ``VERSION``, part of every cell) so that old records are not
mistaken for new ones. Before writing, each cell is trained twice in the process and must give
identical metrics; run the test afterwards (a second process) to check them across processes.

Checking outside pytest prints every cell's largest deviation (``--reverse``: in reverse order)::

    python tests/test_loop_freeze.py --check [--reverse] [--only <cell id> ...]
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import pytest
import torch

TESTS = Path(__file__).resolve().parent
if str(TESTS.parent) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(TESTS.parent))

from fedlib.reporting.results import canonical_json, config_hash  # noqa: E402

FROZEN_FILE = TESTS / "frozen" / "loop_metrics.json"
#: absolute tolerance of every metric (the issue: the migrated loops reproduce them to 1e-6)
TOLERANCE = 1e-6

#: where each paper's cell builders and ``run_cell`` live: the first importable module of each
#: tuple (the paper's folder, ``fedlib/papers/<slug>/experiment.py``; list a second place here
#: if a paper ever moves again)
PAPER_MODULES = {paper: (f"fedlib.papers.{paper}.experiment",)
                 for paper in ("f3crec", "fedrkg", "fedkdrec", "fedpcl_cdr", "fedcsr")}


def paper_module(paper: str):
    """The module of ``paper``'s cell builders and ``run_cell`` (see :data:`PAPER_MODULES`)."""
    for name in PAPER_MODULES[paper]:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not (name == error.name or name.startswith(error.name + ".")):
                raise  # the module exists but one of its own imports is missing
    raise ModuleNotFoundError(f"none of {PAPER_MODULES[paper]} can be imported for paper {paper!r}: add the module "
                              "that now holds its cell() and run_cell() to PAPER_MODULES")


# ======================================================================================
# The tiny cells
# ======================================================================================
@dataclass(frozen=True)
class TinyCell:
    """One frozen cell: ``build(module) -> config`` with the paper's own cell builders.

    ``id`` is ``"<paper>/<label>"``; ``label`` is the paper's row label (plus what
    distinguishes a path-coverage cell, e.g. ``"FedRKG (LDP)"``). ``data`` names the real
    dataset the cell needs (``None``: synthetic, always available).
    """

    paper: str
    label: str
    build: Callable[[Any], Dict[str, Any]] = field(compare=False)
    data: Optional[str] = None

    @property
    def id(self) -> str:
        return f"{self.paper}/{self.label}"

    def config(self) -> Dict[str, Any]:
        return self.build(paper_module(self.paper))


# F3CRec: the smoke profile's drifting synthetic stream (4 blocks: block 0 plain, then three
# incremental blocks), its 3 rounds per block and patience 2; d = 8.
F3 = dict(rounds=3, patience=2, dim=8, seed=0)
F3_METHODS = ("FT", "Reg", "KD", "RLP2", "SPP", "F3CRec")
F3_BACKBONES = ("FedMF", "FedNCF", "PFedRec")
F3_ABLATIONS = ("w/o c.c", "w/o a.r.m", "w/o s.c", "w/o i.t.m")


def _f3crec_cells() -> List[TinyCell]:
    cells = [TinyCell("f3crec", f"{b} {m}", lambda X, b=b, m=m: X.cell("synthetic", b, m, **F3))
             for b in F3_BACKBONES for m in F3_METHODS]
    # Tables 3 and 6 ablate on FedMF, whose client-side terms do not reorder a ranking within 3
    # rounds (there KD = FT = w/o s.c and F3CRec = w/o c.c = w/o a.r.m = w/o i.t.m); on FedNCF
    # every flag moves the metrics, so the same ablations are frozen there too
    cells += [TinyCell("f3crec", f"{b} {a}", lambda X, a=a, b=b: X.cell("synthetic", b, a, **F3))
              for b in ("FedMF", "FedNCF") for a in F3_ABLATIONS]
    cells += [
        # Table 8: Laplace noise on every upload (WithUploadNoise around the method). Frozen again
        # at version 2 (issue 43: the counter-based noise drawn for all clients at once changed its
        # random stream, not its distribution); its noiseless siblings did not move.
        TinyCell("f3crec", "FedMF F3CRec (upload noise 0.1)",
                 lambda X: X.cell("synthetic", "FedMF", "F3CRec", upload_noise=0.1, **F3)),
        # Tables 4, 5, 7: F3CRec records its preference shifts (record_shifts=True; measuring only)
        TinyCell("f3crec", "FedMF F3CRec (analysis)",
                 lambda X: X.cell("synthetic", "FedMF", "F3CRec", analysis=True, **F3)),
        # the split audit: the per-user random split of the paper's text
        TinyCell("f3crec", "FedMF FT (random split)",
                 lambda X: X.cell("synthetic", "FedMF", "FT", split="random", tuned=False, **F3)),
    ]
    return cells


# FedRKG: the smoke profile's synthetic leave-last-out split (80 users, 120 items), 4 rounds
# evaluated every round, d = 8. FedRKG's cells guide every round (interval 1: before rounds
# t = 2 and 3) with β = 0.5 and gate lr 0.1 (values of the paper's strength and gate-lr sweeps):
# at the paper's β = 0.99 and gate lr 1e-4 four rounds leave FedRKG, w/o AG and w/ PIE with
# identical metrics, so the guidance would not be seen by the freeze.
RKG = dict(rounds=4, eval_every=1, dim=8, seed=0)
RKG_GUIDANCE = dict(interval=1, params={"beta": 0.5, "gate_lr": 0.1})
RKG_METHODS = ("MF", "NeuMF", "FedMF", "FedNCF", "PFedRec", "GPFedRec", "CoFedRec", "FedRAP", "FedDAE")
RKG_MODES = {"adaptive": "FedRKG", "fixed": "w/o AG", "global_only": "w/ GIE", "personal_only": "w/ PIE"}


def _rkg(X, guidance: str = "adaptive", **kwargs) -> Dict[str, Any]:
    """A tiny FedRKG cell (guidance every round, see above)."""
    return X.cell("synthetic", "FedRKG", guidance=guidance, **RKG_GUIDANCE, **RKG, **kwargs)


def _fedrkg_cells() -> List[TinyCell]:
    cells = [TinyCell("fedrkg", m, lambda X, m=m: X.cell("synthetic", m, **RKG)) for m in RKG_METHODS]
    cells += [TinyCell("fedrkg", label, lambda X, g=g: _rkg(X, g)) for g, label in RKG_MODES.items()]
    cells += [TinyCell("fedrkg", f"{b} w/ AG", lambda X, b=b: _rkg(X, backbone=b)) for b in ("FedNCF", "PFedRec")]
    # Table 5: clipped and noised local gradients. The four LDP cells were frozen again at version 2
    # (issue 43: the counter-based gradient noise changed their random stream, not its distribution).
    cells += [TinyCell("fedrkg", f"{m} (LDP)", lambda X, m=m: X.cell("synthetic", m, ldp=X.LDP, **RKG))
              for m in ("FedMF", "PFedRec", "FedRAP")]
    cells += [
        TinyCell("fedrkg", "FedRKG (LDP)", lambda X: _rkg(X, ldp=X.LDP)),
        # Table 4: per-user metrics and gates around the last guidance round (a wrapped before_round);
        # measuring only, so these equal the FedRKG / w/o AG cells
        TinyCell("fedrkg", "w/o AG (probe)", lambda X: _rkg(X, "fixed", probe_round=3)),
        TinyCell("fedrkg", "FedRKG (probe)", lambda X: _rkg(X, probe_round=3)),
        # the audit's leak trace (an extra round hook; measuring only)
        TinyCell("fedrkg", "FedRKG (leak trace)", lambda X: _rkg(X, trace_every=1)),
        # the public code's negative sampler (also excludes validation and test items)
        TinyCell("fedrkg", "FedRKG (leaky sampler)", lambda X: _rkg(X, sampler="leaky")),
        TinyCell("fedrkg", "FedMF (leaky sampler)", lambda X: X.cell("synthetic", "FedMF", sampler="leaky", **RKG)),
    ]
    # FedRAP with its public code's local training (10 epochs; + its optimiser: FedRAPCodeExecutor)
    for variant in ("epochs", "optimizer"):
        cells.append(TinyCell("fedrkg", f"FedRAP (code {variant})",
                              lambda X, v=variant: X.fedrap_code_cells(["synthetic"], ["correct"], [v], **RKG)[0]))
    return cells


# FedKDRec: the smoke profile's synthetic leave-one-out split (60 users, 200 items), its 4 rounds
# evaluated every 2 (10 % of the clients per round) and 2 centralised epochs; d = 8.
KD = dict(rounds=4, central_epochs=2, eval_every=2, dim=8, seed=0)
KD_BACKBONES = ("NeuMF", "NeuNCF", "LightGCN")
KD_TABLE2_VARIANTS = ("-m", "-c", "-s", "~s")  # on every backbone (with FedKDRec and PTF-FedRec = -m-c~s)
KD_TABLE4_VARIANTS = ("w/o sample size", "w/o statistics info", "w/o BCE loss", "w/o R_i", "w/o R_i^s",
                      "w/o R_i^l")  # on NeuNCF, the paper's Table 4 backbone
#: the text item initialisation needs the side information of a real dataset: ML-100K, 2 rounds
#: (10 % of its 943 users per round), 1 centralised epoch; the autoencoder is trained once per process
KD_TEXT = dict(rounds=2, central_epochs=1, eval_every=2, dim=8, seed=0, init="text")


def _fedkdrec_cells() -> List[TinyCell]:
    cells = [TinyCell("fedkdrec", m, lambda X, m=m: X.cell("synthetic", m, **KD))
             for m in ("FedMF", "FedNCF", "FedPerGNN")]
    for b in KD_BACKBONES:
        cells += [TinyCell("fedkdrec", f"{m} {b}", lambda X, m=m, b=b: X.cell("synthetic", m, backbone=b, **KD))
                  for m in ("Centralized", "FedKDRec", "PTF-FedRec")]
        cells += [TinyCell("fedkdrec", f"{v} {b}", lambda X, v=v, b=b: X.cell("synthetic", "FedKDRec", backbone=b,
                                                                              variant=v, **KD))
                  for v in KD_TABLE2_VARIANTS]
    cells += [TinyCell("fedkdrec", f"{v} NeuNCF", lambda X, v=v: X.cell("synthetic", "FedKDRec", backbone="NeuNCF",
                                                                         variant=v, **KD))
              for v in KD_TABLE4_VARIANTS]
    # the item-initialisation part: item tables from the side-information autoencoder
    cells += [TinyCell("fedkdrec", f"{m} NeuMF (text init, ML-100K)",
                       lambda X, m=m: X.cell("ML-100K", m, backbone="NeuMF", **KD_TEXT), data="ml-100k")
              for m in ("Centralized", "PTF-FedRec", "FedKDRec")]
    return cells


# FedPCL-CDR: the smoke profile's synthetic two-domain task (240 users, 200 items per domain),
# 2 rounds (epochs), d = 8.
PCL = dict(rounds=2, patience=2, dim=8, seed=0)
PCL_BASELINES = ("NeuMF", "LightGCN", "FedNCF", "GA-DTCDR", "GA-MTCDR-P", "NMCDR", "CL-DTCDR", "PriCDR", "P2FCDR",
                 "P2DTR")
PCL_VARIANTS = ("FedPCL-CDR", "w/o loc-proto", "w/o glob-proto", "w/o LDP", "w/o CL")


def _fedpcl_cdr_cells() -> List[TinyCell]:
    cells = [TinyCell("fedpcl_cdr", m, lambda X, m=m: X.cell("synthetic", m, **PCL)) for m in PCL_BASELINES]
    cells += [TinyCell("fedpcl_cdr", v, lambda X, v=v: X.cell("synthetic", "FedPCL-CDR", variant=v, **PCL))
              for v in PCL_VARIANTS]
    cells += [
        # Table 4: part of the overlapping users
        TinyCell("fedpcl_cdr", "FedPCL-CDR (overlap 0.5)",
                 lambda X: X.cell("synthetic", "FedPCL-CDR", overlap_ratio=0.5, **PCL)),
        TinyCell("fedpcl_cdr", "GA-DTCDR (overlap 0.5)",
                 lambda X: X.cell("synthetic", "GA-DTCDR", overlap_ratio=0.5, **PCL)),
        # the audit: the code's one mini-batch per round, 98 negatives, selection on test
        TinyCell("fedpcl_cdr", "FedPCL-CDR (code: one batch, test selection)",
                 lambda X: X.cell("synthetic", "FedPCL-CDR", num_negatives=98, batches_per_round=1, selection="test",
                                  **{**PCL, "rounds": 3})),
    ]
    return cells


# FedCSR: the synthetic two-domain sequence task of the tests (120 users over 10 platforms,
# 30 items per domain, 1 + 20 candidates), 2 rounds of 1 local epoch, d = 8, window 6, and the
# smoke profile's lr 0.02 (at the paper's 1e-3 two rounds barely move the model: FedCSR,
# w/o single and w/o unified then give identical metrics).
CSR = dict(dim=8, rounds=2, patience=2, local_epochs=1, batch_size=64, maxlen=6, lr=0.02, seed=0)
CSR_VARIANTS = ("FedCSR", "w/o SCL", "w/o MCL", "w/o SCL & MCL", "w/o unified", "w/o single",
                "code: prediction only", "code: central graph", "code: shared Adam", "code: all")
CSR_BASELINES = ("TiSASRec", "CLSR", "CoNet", "CCDR", "PiNet", "PSJNet", "MIFN", "C2DSR")


def _fedcsr_cells() -> List[TinyCell]:
    cells = [TinyCell("fedcsr", v, lambda X, v=v: X.cell("synthetic", "FedCSR", variant=v, **CSR))
             for v in CSR_VARIANTS]
    cells += [TinyCell("fedcsr", m, lambda X, m=m: X.cell("synthetic", m, **CSR))
              for m in ("Individual", "Centralized") + CSR_BASELINES]
    cells += [
        # the sampled softmax of the real-data cells (synthetic cells default to the full softmax)
        TinyCell("fedcsr", "FedCSR (sampled softmax)",
                 lambda X: X.cell("synthetic", "FedCSR", sampled_negatives=10, **CSR)),
        TinyCell("fedcsr", "C2DSR (sampled softmax)",
                 lambda X: X.cell("synthetic", "C2DSR", sampled_negatives=10, **CSR)),
        # the lesson's smaller federation: the platforms with the most sequences
        TinyCell("fedcsr", "FedCSR (3 platforms)", lambda X: X.cell("synthetic", "FedCSR", platforms=3, **CSR)),
    ]
    return cells


CELLS: List[TinyCell] = (_f3crec_cells() + _fedrkg_cells() + _fedkdrec_cells() + _fedpcl_cdr_cells()
                         + _fedcsr_cells())


def row_label(paper: str, config: Mapping[str, Any]) -> str:
    """The table row a cell belongs to, with the backbone where a paper's rows repeat per backbone."""
    X = paper_module(paper)
    if paper == "f3crec":
        return f"{config['backbone']} {config['method']}"
    if paper == "fedkdrec":
        return " ".join(filter(None, (X.method_label(config), config["backbone"])))
    return X.method_label(config)


#: keyword arguments for grid parts whose default reads the data root (FedPCL-CDR's available
#: tasks), so that the labels of the grid do not depend on which files are present
GRID_PART_KWARGS = {"fedpcl_cdr": {"table2": {"tasks": ["Phone-Sport"]}, "ablation": {"tasks": ["Phone-Sport"]}}}


def grid_row_labels(paper: str) -> set:
    """Every row label of every part of the paper's grid (its ``grid_cells(part)`` for each of ``PARTS``)."""
    X = paper_module(paper)
    kwargs = GRID_PART_KWARGS.get(paper, {})
    return {row_label(paper, config) for part in X.PARTS for config in X.grid_cells(part, **kwargs.get(part, {}))}


# ======================================================================================
# Training a cell and comparing its metrics
# ======================================================================================
def is_wall_time(name: str) -> bool:
    """Metrics that measure wall time (``seconds``, F3CRec's ``seconds/D1``): never frozen."""
    return name == "seconds" or name.startswith("seconds/")


def run_tiny_cell(cell: TinyCell, config: Mapping[str, Any], cache_dir: Path) -> Dict[str, Any]:
    """The cell's metrics from the paper's ``run_cell`` on the CPU (wall time dropped).

    ``cache_dir``: F3CRec keeps each block-0 model there (shared by the cells of one backbone).
    """
    module = paper_module(cell.paper)
    if cell.paper == "f3crec":
        result = module.run_cell(config, cache_dir=cache_dir, device="cpu")
    else:
        result = module.run_cell(config, device="cpu")
    return {k: v for k, v in result["metrics"].items() if not is_wall_time(k)}


def encode(value: Any) -> Any:
    """A metric as JSON: floats as they are, non-finite floats as strings (``"nan"``, ``"inf"``)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    value = float(value)
    return value if math.isfinite(value) else repr(value)


def decode(value: Any) -> Any:
    return float(value) if isinstance(value, str) and value in ("nan", "inf", "-inf") else value


def deviations(frozen: Mapping[str, Any], metrics: Mapping[str, Any]) -> Tuple[List[str], List[Tuple[float, str]]]:
    """``(problems, [(deviation, metric), ...])``: missing / new / non-numeric mismatches, and
    the absolute deviation of every numeric metric (NaN equals NaN; NaN against a number is inf)."""
    problems = []
    missing, new = sorted(set(frozen) - set(metrics)), sorted(set(metrics) - set(frozen))
    if missing:
        problems.append(f"metrics no longer produced: {missing}")
    if new:
        problems.append(f"metrics not frozen: {new}")
    out = []
    for name in sorted(set(frozen) & set(metrics)):
        want, got = decode(frozen[name]), decode(encode(metrics[name]))
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and None not in (want, got):
            want, got = float(want), float(got)
            if math.isnan(want) and math.isnan(got):
                out.append((0.0, name))
            elif math.isnan(want) or math.isnan(got):
                out.append((math.inf, name))
            elif want == got:  # covers equal infinities
                out.append((0.0, name))
            else:
                out.append((abs(want - got), name))
        elif want != got:
            problems.append(f"{name}: frozen {want!r}, now {got!r}")
    return problems, out


def read_frozen() -> Dict[str, Dict[str, Any]]:
    if not FROZEN_FILE.exists():
        raise FileNotFoundError(f"{FROZEN_FILE} is missing: create it with `python tests/test_loop_freeze.py "
                                "--refreeze` (only from code whose numbers are the reference)")
    with FROZEN_FILE.open() as handle:
        return json.load(handle)["cells"]


def data_problem(cell: TinyCell, root: Path) -> Optional[str]:
    """Why the cell's real dataset cannot be read from ``root`` (``None``: synthetic, or present)."""
    if cell.data is not None and not (root / cell.data).is_dir():
        return f"{cell.id} needs the dataset folder {cell.data}/ under the data root {root} (set FEDLIB_DATA)"
    return None


# ======================================================================================
# Tests
# ======================================================================================
@pytest.fixture(scope="module")
def frozen() -> Dict[str, Dict[str, Any]]:
    return read_frozen()


@pytest.fixture(scope="module")
def f3crec_cache(tmp_path_factory) -> Path:
    """F3CRec's block-0 models, trained once per backbone and shared by that backbone's cells."""
    return tmp_path_factory.mktemp("f3crec-base")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the frozen numbers were computed with it (reductions split across
    threads may add in another order)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_every_cell_is_frozen_and_every_frozen_entry_is_a_cell(frozen):
    ids = [c.id for c in CELLS]
    assert len(ids) == len(set(ids)), "two tiny cells share an id"
    assert sorted(set(ids) - set(frozen)) == [], "cells without frozen metrics: run --refreeze --only <id>"
    assert sorted(set(frozen) - set(ids)) == [], "frozen entries of cells that no longer exist: remove them"


@pytest.mark.parametrize("paper", sorted(PAPER_MODULES))
def test_every_row_label_of_the_grid_has_a_tiny_cell(paper):
    covered = {row_label(paper, c.config()) for c in CELLS if c.paper == paper}
    missing = sorted(grid_row_labels(paper) - covered)
    assert not missing, f"{paper}: grid rows without a frozen tiny cell: {missing} (add them to the cells of {paper})"


@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_cell_reproduces_its_frozen_metrics(cell, frozen, f3crec_cache, request, monkeypatch):
    if cell.data is not None:
        from conftest import missing_data

        root = request.getfixturevalue("shared_data")
        reason = data_problem(cell, root)
        if reason is not None:
            missing_data(reason)
        monkeypatch.setenv("FEDLIB_DATA", str(root))
        monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    entry = frozen.get(cell.id)
    assert entry is not None, f"{cell.id} has no frozen entry: run `python {Path(__file__).name} --refreeze --only " \
                              f"'{cell.id}'` (from code whose numbers are the reference)"
    config = cell.config()
    if canonical_json(config) != canonical_json(entry["config"]):
        changed = sorted(k for k in set(config) | set(entry["config"])
                         if canonical_json(config.get(k)) != canonical_json(entry["config"].get(k)))
        pytest.fail(f"{cell.id}: the paper's cell builder now gives another configuration (keys {changed}); "
                    "recorded config hashes would no longer match. Restore the builder, or bump the paper's "
                    "VERSION and refreeze if the change is meant to move numbers.")
    assert config_hash(config) == entry["config_hash"], f"{cell.id}: config hash {config_hash(config)} != frozen"
    metrics = run_tiny_cell(cell, config, f3crec_cache)
    vendor = cpu_vendor()
    reference = entry.get("metrics_on", {}).get(vendor, entry["metrics"])
    problems, deviation = deviations(reference, metrics)
    worst = max(deviation, default=(0.0, None))
    off = [f"{name}: frozen {reference[name]!r}, now {metrics[name]!r} (|Δ| = {d:.3g})"
           for d, name in sorted(deviation, reverse=True) if d > TOLERANCE]
    assert not problems and not off, (
        f"{cell.id} moved on a {vendor} CPU: largest deviation {worst[0]:.3g} in {worst[1]!r} (tolerance {TOLERANCE:g}); "
        + "; ".join(problems + off[:10]) + ("" if len(off) <= 10 else f"; … {len(off) - 10} more"))


def cpu_vendor() -> str:
    """The CPU vendor of this machine (``vendor_id`` of /proc/cpuinfo, e.g. ``GenuineIntel`` or
    ``AuthenticAMD``; ``platform.processor()`` elsewhere).

    Two FedPCL-CDR cells (``CL-DTCDR``, ``FedPCL-CDR``) give other float32 results on an AMD
    EPYC machine than on the machine that froze them (whose metrics stay the default): the same
    code and torch build reorder one ranking (a deviation of 0.0056 in HR) or move an MRR by
    6e-6. Their entries also hold the AMD metrics (``metrics_on``), so each machine is held to
    the numbers its own CPU reproduces."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ======================================================================================
# Refreezing (a script, never run by pytest)
def refreeze(only: Optional[List[str]] = None, repeats: int = 2) -> None:
    """Rewrite :data:`FROZEN_FILE` from today's code: **only** when a change is meant to move
    numbers, and then with the moved cells' ``version`` bumped.

    Each cell is trained ``repeats`` times in this process (each with a fresh F3CRec block-0
    cache, so the cached and the freshly trained block 0 are both exercised) and must give
    identical metrics, else nothing is written. ``only``: refreeze these cell ids, keep the
    other entries as they are.
    """
    import tempfile

    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from conftest import data_root as default_data_root

    torch.set_num_threads(1)
    data_root = default_data_root()  # FEDLIB_DATA, else the CI layout beside the checkout
    os.environ["FEDLIB_DATA"] = str(data_root)
    os.environ["FEDLIB_OFFLINE"] = "1"
    known = {c.id: c for c in CELLS}
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise SystemExit(f"unknown cell id(s) {unknown}; known ids: {sorted(known)}")
    entries = read_frozen() if (only and FROZEN_FILE.exists()) else {}
    entries = {k: v for k, v in entries.items() if k in known}
    chosen = [known[i] for i in only] if only else CELLS
    timings = []
    with tempfile.TemporaryDirectory(prefix="loop-freeze-") as tmp:
        for cell in chosen:
            reason = data_problem(cell, data_root)
            if reason is not None:
                raise SystemExit(f"cannot freeze: {reason}")
            config = cell.config()
            runs = []
            for repeat in range(repeats):
                started = time.perf_counter()
                runs.append(run_tiny_cell(cell, config, Path(tmp) / f"cache{repeat}"))
                timings.append((time.perf_counter() - started, cell.id))
            for other in runs[1:]:
                problems, deviation = deviations({k: encode(v) for k, v in runs[0].items()}, other)
                moved = [(d, n) for d, n in deviation if d != 0.0]
                if problems or moved:
                    raise SystemExit(f"{cell.id} is not deterministic within one process: {problems} {moved[:5]}; "
                                     "nothing written")
            entries[cell.id] = {"paper": cell.paper, "label": cell.label, "config": config,
                                "config_hash": config_hash(config),
                                "metrics": {k: encode(v) for k, v in sorted(runs[0].items())}}
            print(f"{cell.id:<55} {timings[-1][0]:6.2f} s  {len(runs[0])} metrics", flush=True)
    FROZEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    from fedlib.reporting.results import current_commit

    document = {"about": "Metrics of one tiny cell per training loop and method label, frozen before the loops are "
                         "replaced (issue 42). Written by `python tests/test_loop_freeze.py --refreeze`; read by "
                         "tests/test_loop_freeze.py. Tolerance 1e-6 absolute; wall-time metrics are not frozen.",
                "code": current_commit(TESTS.parent), "precision": "float32 (no cell exposes a dtype)", "threads": 1,
                "cells": entries}
    text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
    partial = FROZEN_FILE.with_suffix(".json.tmp")
    partial.write_text(text + "\n")
    partial.replace(FROZEN_FILE)
    slowest = sorted(timings, reverse=True)[:5]
    print(f"wrote {len(entries)} cells to {FROZEN_FILE.relative_to(TESTS.parent)}; slowest runs: "
          + ", ".join(f"{i} {s:.1f} s" for s, i in slowest))


def check(only: Optional[List[str]] = None, reverse: bool = False) -> int:
    """Train the cells (all, or ``only``) against the frozen file outside pytest and print each
    cell's largest deviation and seconds; ``reverse`` trains them in the opposite order (the
    cells share cached data, so a cell that changed that data would show here). Returns the
    number of cells that moved beyond :data:`TOLERANCE`."""
    import tempfile

    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from conftest import data_root as default_data_root

    torch.set_num_threads(1)
    os.environ.setdefault("FEDLIB_DATA", str(default_data_root()))
    os.environ["FEDLIB_OFFLINE"] = "1"
    frozen = read_frozen()
    chosen = [c for c in CELLS if not only or c.id in only]
    chosen = chosen[::-1] if reverse else chosen
    moved, timings = 0, []
    with tempfile.TemporaryDirectory(prefix="loop-freeze-") as tmp:
        for cell in chosen:
            started = time.perf_counter()
            metrics = run_tiny_cell(cell, cell.config(), Path(tmp))
            timings.append((time.perf_counter() - started, cell.id))
            problems, deviation = deviations(frozen[cell.id]["metrics"], metrics)
            worst = max(deviation, default=(0.0, "-"))
            bad = bool(problems) or worst[0] > TOLERANCE
            moved += bad
            print(f"{cell.id:<55} {timings[-1][0]:6.2f} s  largest deviation {worst[0]:.3g} ({worst[1]})"
                  + (f"  MOVED {problems}" if bad else ""), flush=True)
    print(f"{len(chosen)} cells, {moved} moved; {sum(t for t, _ in timings):.1f} s in cells; slowest: "
          + ", ".join(f"{i} {t:.1f} s" for t, i in sorted(timings, reverse=True)[:5]))
    return moved


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=refreeze.__doc__.split("\n\n")[0])
    parser.add_argument("--refreeze", action="store_true",
                        help="rewrite tests/frozen/loop_metrics.json from today's code (only for a change meant to "
                             "move numbers, with the cells' version bumped)")
    parser.add_argument("--only", nargs="+", metavar="CELL_ID", help="refreeze these cells only (ids as in the test)")
    parser.add_argument("--check", action="store_true",
                        help="compare today's code with the frozen file, printing every cell's largest deviation")
    parser.add_argument("--reverse", action="store_true", help="with --check: train the cells in reverse order")
    parser.add_argument("--list", action="store_true", help="print the cell ids and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(c.id for c in CELLS))
        return
    if args.refreeze == args.check:
        parser.error("pass exactly one of --refreeze or --check (or --list)")
    if args.check:
        raise SystemExit(1 if check(args.only, args.reverse) else 0)
    refreeze(args.only)


if __name__ == "__main__":
    main()
