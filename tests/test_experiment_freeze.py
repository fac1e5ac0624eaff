"""What the experiment specifications produce today, frozen so a refactor can prove it kept them.

Issue 42 ("what must not be lost") moves every paper's grid and tables to new code. Four guards
hold the old behaviour, each against files in ``tests/frozen/``:

1. **Grid specification** (``grid_cells.json``, ``grid_configs.json``): for every paper and part,
   with the options the command line passes by default (and, for the dataset options, with every
   dataset the specification knows, including those that need a download), the ordered list of
   cell config hashes. ``grid_configs.json`` holds each hash's configuration, so a failure shows
   the configuration of a cell that disappeared, and every hash is checked to re-hash from it.
2. **Records** (``known_orphans.json``): every line of ``results/<paper>/runs.jsonl`` is a grid
   cell (at the seeds the recorded grid used), a data-statistics record, a record of an older
   config ``version`` whose current-version cell is in the grid, or a known orphan listed with
   the reason it no longer belongs to any grid. The counts are asserted exactly
   (:data:`EXPECTED_RECORD_COUNTS`), so a record that silently stops matching fails.
3. **Pending** (``pending.json``): the cells ``--pending`` lists for each command line
   (:data:`SEED_RUNS` adds the seed sets the recorded grid was run with).
4. **Tables** (``tables.json``): every ``results/<paper>/*.csv`` is rebuilt by the paper's
   ``write_tables("paper")`` from a copy of ``results/`` and is byte-identical to the committed
   file (whose sha256 is frozen too). Known exceptions are listed there with their reason.

A change that is *meant* to alter a grid regenerates the frozen files with
``python tests/frozen/refreeze.py`` (read its docstring first) and says so in its commit.
The command lines are those of ``python -m fedlib.experiments.<paper>`` (``grid_main``); when the
refactor replaces them, :func:`command_cells` is the one place to point at the new specification.
"""
from __future__ import annotations

import dataclasses
import filecmp
import functools
import hashlib
import importlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import pytest

from conftest import missing_data

FROZEN = Path(__file__).resolve().parent / "frozen"
REFREEZE_HINT = ("if this change to the grid is intended, run `python tests/frozen/refreeze.py` and say so (and why) "
                 "in the commit message; otherwise the change altered cells that records and tables depend on")
PAPERS = ("fedrkg", "f3crec", "fedkdrec", "fedpcl_cdr", "fedcsr")  # fedlib.paths.PAPER_SLUGS, checked below

#: Options each paper's command line hands to ``grid_cells`` when none is given: the datasets of
#: the recorded grid (``--datasets`` / ``--dataset`` defaults). FedPCL-CDR has no task option: its
#: ``table2`` and ``ablation`` parts take every task whose files are in the data root, which were
#: these three when the grid was recorded; they are pinned so the freeze does not depend on the data root.
DEFAULT_OPTIONS: Dict[str, Dict[str, Any]] = {
    "fedrkg": {"datasets": ("Amazon-Video", "FilmTrust", "LastFM-2K")},
    "f3crec": {"datasets": ("ML-100K", "ML-Latest-Small", "Lastfm-2K")},
    "fedkdrec": {"dataset": "ML-100K"},
    "fedpcl_cdr": {},
    "fedcsr": {},
}
FEDPCL_RECORDED_TASKS = ("Phone-Sport", "Elec-Cloth", "Book-Music")
FEDPCL_TASK_PARTS = ("table2", "ablation")
FEDPCL_EVERY_TASK = ("Phone-Sport", "Elec-Cloth", "Book-Music", "Movie-Music", "Book-Movie-Music",
                     "Phone-Sport (original)", "Elec-Cloth-Phone (original)", "Movie-Music (original)",
                     "Book-Movie-Music (original)")

#: The dataset options with every dataset the specification knows, including those that need a
#: download: their cells were never run and must stay pending (not vanish) after the refactor.
#: ``(command-line spelling, options)``; a part whose cells these options do not change is skipped.
EVERY_DATASET_OPTIONS: Dict[str, List[Tuple[str, Dict[str, Any]]]] = {
    "fedrkg": [("--datasets Amazon-Video FilmTrust LastFM-2K ML-1M",
                {"datasets": ("Amazon-Video", "FilmTrust", "LastFM-2K", "ML-1M")})],
    "f3crec": [("--datasets ML-100K ML-Latest-Small Lastfm-2K HetRec2011",
                {"datasets": ("ML-100K", "ML-Latest-Small", "Lastfm-2K", "HetRec2011")})],
    "fedkdrec": [("--dataset ML-1M", {"dataset": "ML-1M"}), ("--dataset Industrial", {"dataset": "Industrial"})],
    "fedpcl_cdr": [("[every task's files in the data root]", {"tasks": FEDPCL_EVERY_TASK})],
    "fedcsr": [],
}


@dataclasses.dataclass(frozen=True)
class Command:
    """One command line of a paper's grid: the cells it hands to the runner (or lists with ``--pending``).

    ``keep`` is the command line's cell filters (``--samplers correct``), or a selection no option
    expresses (then ``command`` says so in words).
    """
    command: str
    parts: Tuple[str, ...]
    options: Mapping[str, Any]
    seeds: Tuple[int, ...] = (0,)
    keep: Optional[Callable[[Mapping[str, Any]], bool]] = None


def _strength_seed_cell(config: Mapping[str, Any]) -> bool:
    params = config["params"]
    return config["guidance"] == "adaptive" and params["beta"] == 0.5 and params["interval"] == 10


#: The seed sets the recorded grid was run with beyond seed 0, as found in runs.jsonl: FedRKG's
#: Table 1 under the correct sampler on FilmTrust and Amazon-Video (fedrkg.main's docstring), one
#: guidance-strength cell at seeds 1 and 2 (a selection no command-line option expresses), and
#: FedKDRec's Tables 1-2 (the command docs/results.md gives).
SEED_RUNS: Dict[str, List[Command]] = {
    "fedrkg": [
        Command("table1 --datasets FilmTrust Amazon-Video --samplers correct --seeds 0 1 2 3 4", ("table1",),
                {"datasets": ("FilmTrust", "Amazon-Video")}, (0, 1, 2, 3, 4), lambda c: c["sampler"] == "correct"),
        Command("strength --seeds 0 1 2, only FedRKG adaptive with beta 0.5 and T_int 10", ("strength",),
                DEFAULT_OPTIONS["fedrkg"], (0, 1, 2), _strength_seed_cell),
    ],
    "fedkdrec": [Command("table1 ablation --seeds 0 1 2 3 4", ("table1", "ablation"), DEFAULT_OPTIONS["fedkdrec"],
                         (0, 1, 2, 3, 4)),
                 # the fair-budget headline (docs/results.md): three seeds
                 Command("headline --seeds 0 1 2", ("headline",), DEFAULT_OPTIONS["fedkdrec"], (0, 1, 2))],
    # the fair-budget headline settings (docs/results.md): three seeds
    "f3crec": [Command("table2 --datasets ML-100K --seeds 0 1 2", ("table2",), {"datasets": ("ML-100K",)}, (0, 1, 2)),
               Command("code_options --seeds 0 1 2", ("code_options",), DEFAULT_OPTIONS["f3crec"], (0, 1, 2))],
    "fedpcl_cdr": [Command("table2 --tasks Phone-Sport --methods FedPCL-CDR NeuMF PriCDR --seeds 0 1 2", ("table2",),
                           {"tasks": ("Phone-Sport",)}, (0, 1, 2),
                           lambda c: c["method"] in ("FedPCL-CDR", "NeuMF", "PriCDR"))],
    "fedcsr": [Command("headline --seeds 0 1 2", ("headline",), DEFAULT_OPTIONS["fedcsr"], (0, 1, 2))],
}

#: Per paper: records (lines of runs.jsonl) per category; ``re-runs`` counts lines whose config was
#: recorded before (a ``--rerun``; they are also counted as grid cells).
EXPECTED_RECORD_COUNTS: Dict[str, Dict[str, int]] = {
    # Issue 43 (counter-based noise) moved the noisy cells to version 2: FedRKG's 8 LDP records and
    # F3CRec's 15 Table 8 records with upload noise > 0 are kept as version 1 ("older version"). The
    # cells were then recorded again at version 2 (8 FedRKG and 15 F3CRec lines, 29 Nov 2026).
    # Issue 45: the headline's learning rates (headline_tuning, 50 lines) and Table 1's headline cells
    # at the chosen rates or re-run from committed code (12 new lines, 16 dirty records replaced in
    # place); the 12 records at the code's rate that Table 1 no longer reads became known orphans.
    # FedDAE with its code's server Adam (feddae_server): 3 lines, then 8 more (11 of its 12 cells),
    # then its last cell and 4 at 3e-2 (5 lines); Table 1's FedDAE took the chosen server Adam, so
    # its FedAvg records at seeds 1-4 (8) became known orphans (seed 0 stays feddae_server's baseline),
    # and its seeds 1-4 under the correct sampler at the chosen rates were recorded (8 lines).
    # Then FedRAP's settings search on Amazon-Video (fedrap_search, 5 lines).
    "fedrkg": {"lines": 321, "grid cell": 285, "data statistics": 3, "older version": 8, "known orphan": 25,
               "re-runs": 0},
    # Issue 45 (fair budgets) tuned each backbone on ML-100K and ran the headline and code-option
    # cells at three seeds (235 lines); the old-configuration records became known orphans (five of
    # them version-1 noise cells at FedMF's old rate, formerly "older version"). Then SPP's probe on
    # Lastfm-2K (spp_probe, 4 lines; its first case, Table 2's cell, re-run from a clean revision in place),
    # then its 5 cells re-run once more to record their per-round curves (5 lines).
    "f3crec": {"lines": 432, "grid cell": 339, "data statistics": 3, "older version": 10, "known orphan": 80,
               "re-runs": 8},
    # Issue 45: headline_tuning at seed 0, all 26 cells (FedPerGNN at 400 rounds, centralised LightGCN at
    # 300 epochs, FedKDRec and PTF-FedRec on every backbone at 400 rounds): 6 lines, then 20, then the
    # first widening (12: FedKDRec to 1e-3 and 2e-2, PTF-FedRec to 2e-3, LightGCN to 3e-2, FedPerGNN 800 rounds),
    # then the first cell of the second (PTF-FedRec on NeuMF at 1e-3), then its other 5 cells, then
    # the headline at the chosen rates and budgets, seeds 1 and 2 (16 lines); then the third widening
    # (FedPerGNN at 1,600 rounds, PTF-FedRec on NeuNCF at 5e-4: 4 lines), which moved FedPerGNN's
    # headline cells to 1,600 rounds and left its 800-round seeds 1 and 2 as known orphans.
    "fedkdrec": {"lines": 233, "grid cell": 230, "data statistics": 1, "older version": 0, "known orphan": 2,
                 "re-runs": 1},
    # Issue 45: the Phone-Sport headline (FedPCL-CDR, NeuMF, PriCDR) at seeds 1 and 2 (6 lines).
    "fedpcl_cdr": {"lines": 112, "grid cell": 109, "data statistics": 3, "older version": 0, "known orphan": 0,
                   "re-runs": 0},
    # Issue 45: the Food-Kitchen headline's seed-0 rate grid (headline_lr) and the headline's
    # seeds 1 and 2, as their cells finish.
    "fedcsr": {"lines": 70, "grid cell": 63, "data statistics": 2, "older version": 1, "known orphan": 4,
               "re-runs": 1},
}

#: Datasets whose statistics the tables record as runs (``grid.statistics_config``; F3CRec's
#: ``fedlib.papers.f3crec.tables.data_statistics_records`` writes its own ``kind: data_blocks`` config).
STATISTICS_DATASETS: Dict[str, Tuple[str, ...]] = {
    "fedrkg": ("Amazon-Video", "FilmTrust", "LastFM-2K"),
    "f3crec": ("ML-100K", "ML-Latest-Small", "Lastfm-2K"),
    "fedkdrec": ("ML-100K",),
    "fedpcl_cdr": FEDPCL_RECORDED_TASKS,
    "fedcsr": ("Food-Kitchen", "Movie-Book"),
}

#: Keyword arguments of ``write_tables("paper", ...)`` that reproduce the recorded tables: the
#: documented call is ``write_tables('paper')`` (docs/results.md); FedPCL-CDR's default tasks are
#: those in the data root, pinned here to the ones present when the tables were written.
WRITE_TABLES_KWARGS: Dict[str, Dict[str, Any]] = {"fedpcl_cdr": {"tasks": FEDPCL_RECORDED_TASKS}}
#: Papers whose ``write_tables`` reads a dataset (FedRKG's Table 4 loads the Amazon-Video split).
TABLES_NEED_DATA = ("fedrkg",)


# ======================================================================================
# Cells of a command line
# ======================================================================================
#: each paper's experiment and tables modules, in its folder (``fedlib/papers/<slug>/``)
PAPER_MODULES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    paper: ((f"fedlib.papers.{paper}.experiment",), (f"fedlib.papers.{paper}.tables",))
    for paper in ("f3crec", "fedrkg", "fedkdrec", "fedpcl_cdr", "fedcsr")
}


def _first_importable(names: Tuple[str, ...]):
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not (name == error.name or name.startswith(error.name + ".")):
                raise  # the module exists but one of its own imports is missing
    raise ModuleNotFoundError(f"none of {names} can be imported")


def paper_module(paper: str):
    return _first_importable(PAPER_MODULES[paper][0])


def tables_module(paper: str):
    return _first_importable(PAPER_MODULES[paper][1])


def part_options(paper: str, part: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` as the paper's ``grid_cells(part, ...)`` receives them for ``part``."""
    if paper == "fedpcl_cdr":
        # no command-line option: table2/ablation default to the data root's tasks, pinned here
        return {"tasks": options.get("tasks", FEDPCL_RECORDED_TASKS)} if part in FEDPCL_TASK_PARTS else {}
    return dict(options)


def command_cells(paper: str, command: Command) -> List[Dict[str, Any]]:
    """The cells ``command`` hands to the grid runner, as ``grid_main`` builds them.

    Parts in order, filters, then every cell at every seed (seed-major) without repeats.
    """
    from fedlib.experiments.grid import unique_cells

    module = paper_module(paper)
    cells = [c for part in command.parts for c in module.grid_cells(part, **part_options(paper, part, command.options))]
    if command.keep is not None:
        cells = [c for c in cells if command.keep(c)]
    return unique_cells({**c, "seed": seed} for seed in command.seeds for c in cells)


@functools.lru_cache(maxsize=None)
def grid_commands(paper: str) -> Tuple[Command, ...]:
    """Every part with the default options, then each part the every-dataset options change (seed 0)."""
    from fedlib.reporting.results import config_hash

    module = paper_module(paper)
    commands = [Command(part, (part,), DEFAULT_OPTIONS[paper]) for part in module.PARTS]
    for spelling, options in EVERY_DATASET_OPTIONS[paper]:
        for part in module.PARTS:
            if paper == "fedpcl_cdr" and part not in FEDPCL_TASK_PARTS:
                continue  # the other parts take no task list
            widened = Command(f"{part} {spelling}", (part,), options)
            default = [config_hash(c) for c in command_cells(paper, Command(part, (part,), DEFAULT_OPTIONS[paper]))]
            if [config_hash(c) for c in command_cells(paper, widened)] != default:
                commands.append(widened)
    return tuple(commands)


@functools.lru_cache(maxsize=None)
def cells_by_command(paper: str, with_seed_runs: bool) -> Dict[str, List[Dict[str, Any]]]:
    commands = grid_commands(paper) + (tuple(SEED_RUNS.get(paper, ())) if with_seed_runs else ())
    return {command.command: command_cells(paper, command) for command in commands}


BASE_LABEL_KEYS = ("method", "variant", "guidance", "backbone", "dataset", "task", "sampler", "split")


def _flat(config: Mapping[str, Any], prefix: str = "") -> Dict[str, str]:
    out = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, separators=(",", ":"))
    return out


def cell_labels(cells: Sequence[Mapping[str, Any]]) -> List[str]:
    """A readable label per cell: its method, dataset, ... then the settings that tell it apart
    from the other cells with the same method and dataset (``params.beta=0.5``)."""
    def base(c):
        values = [str(c[k]) for k in BASE_LABEL_KEYS if c.get(k) is not None]
        return " | ".join(v for i, v in enumerate(values) if i == 0 or v != values[i - 1])  # "FedKDRec | FedKDRec"

    bases = [base(c) for c in cells]
    flat = [_flat(c) for c in cells]
    groups: Dict[str, List[Dict[str, str]]] = {}
    for base, settings in zip(bases, flat):
        groups.setdefault(base, []).append(settings)
    labels = []
    for base, settings in zip(bases, flat):
        group = groups[base]
        keys = sorted({k for s in group for k in s} - set(BASE_LABEL_KEYS))
        varying = [k for k in keys if len({s.get(k, "absent") for s in group}) > 1]
        labels.append(base + ("; " + ", ".join(f"{k}={settings.get(k, 'absent')}" for k in varying) if varying else ""))
    return labels


def hashed(cells: Sequence[Mapping[str, Any]]) -> List[List[str]]:
    """``[[config hash, label], ...]`` in order."""
    from fedlib.reporting.results import config_hash

    return [[config_hash(c), label] for c, label in zip(cells, cell_labels(cells))]


# ======================================================================================
# Frozen files
# ======================================================================================
def dumps_frozen(data: Any, compact_from_depth: Optional[int] = None, _depth: int = 0) -> str:
    """JSON with sorted keys for readable diffs: objects indented (down to ``compact_from_depth``,
    below which an object is one line), a list of scalars on one line, any other list one item per line."""
    pad, inner = "  " * _depth, "  " * (_depth + 1)

    def compact(value):
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))

    if isinstance(data, Mapping) and data and (compact_from_depth is None or _depth < compact_from_depth):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps_frozen(data[k], compact_from_depth, _depth + 1)}"
                 for k in sorted(data)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(data, list) and any(isinstance(item, (list, dict)) for item in data):
        return "[\n" + ",\n".join(inner + compact(item) for item in data) + "\n" + pad + "]"
    return compact(data)


def read_frozen(name: str) -> Any:
    path = FROZEN / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python tests/frozen/refreeze.py` to create it")
    return json.loads(path.read_text(encoding="utf-8"))


def build_grid_freeze() -> Tuple[Dict[str, Dict[str, List[List[str]]]], Dict[str, Dict[str, Any]]]:
    """``(grid_cells.json, grid_configs.json)`` from the code as it is now."""
    from fedlib.reporting.results import config_hash, to_canonical

    grids, configs = {}, {}
    for paper in PAPERS:
        grids[paper] = {}
        for command, cells in cells_by_command(paper, with_seed_runs=False).items():
            grids[paper][command] = hashed(cells)
            configs.update({config_hash(c): to_canonical(c) for c in cells})
    return grids, configs


def build_pending_freeze() -> Dict[str, Dict[str, List[List[str]]]]:
    """``pending.json``: per paper and command line, the cells without a paper-profile record."""
    return {paper: pending_by_command(paper) for paper in PAPERS}


def pending_by_command(paper: str) -> Dict[str, List[List[str]]]:
    """``[[hash, label], ...]`` of the cells ``--pending`` lists, per command line (seed runs included)."""
    from fedlib.experiments.grid import pending_cells
    from fedlib.reporting.results import config_hash

    out = {}
    for command, cells in cells_by_command(paper, with_seed_runs=True).items():
        pending = {config_hash(c) for c in pending_cells(paper, "paper", cells)}
        out[command] = [pair for pair in hashed(cells) if pair[0] in pending]
    return out


def committed_csvs(paper: str) -> Dict[str, Path]:
    from fedlib.paths import project_root

    return {path.name: path for path in sorted((project_root() / "results" / paper).glob("*.csv"))}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_tables_freeze(previous: Mapping[str, Any]) -> Dict[str, Any]:
    """``tables.json``: the sha256 of every committed CSV; the hand-written exceptions are kept."""
    return {"csv_sha256": {paper: {name: sha256(path) for name, path in committed_csvs(paper).items()}
                           for paper in PAPERS},
            "known_exceptions": dict(previous.get("known_exceptions", {}))}


# ======================================================================================
# 1. Grid specification
# ======================================================================================
def test_the_frozen_papers_are_every_paper():
    from fedlib.paths import PAPER_SLUGS

    assert set(PAPERS) == set(PAPER_SLUGS), (
        f"fedlib.paths.PAPER_SLUGS is {PAPER_SLUGS}, the freeze covers {PAPERS}: "
        "add the new paper's grid here and refreeze")


def test_frozen_configs_rehash_to_their_keys():
    """The hash function itself is frozen: every recorded run id depends on it."""
    from fedlib.reporting.results import config_hash

    configs = read_frozen("grid_configs.json")
    wrong = {key: config_hash(config) for key, config in configs.items() if config_hash(config) != key}
    assert not wrong, (f"config_hash no longer maps {len(wrong)} of {len(configs)} frozen configs to their hash "
                       f"(e.g. {next(iter(wrong.items()))} as (frozen, now)): every run id in runs.jsonl would change")


def _config_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    before, after = _flat(old), _flat(new)
    changed = [f"{k}: {before.get(k, 'absent')} -> {after.get(k, 'absent')}" for k in sorted(set(before) | set(after))
               if before.get(k) != after.get(k)]
    return "; ".join(changed)


def describe_grid_change(paper: str, command: str, frozen: Sequence[Sequence[str]], cells: Sequence[Mapping[str, Any]],
                         configs: Mapping[str, Any]) -> str:
    from fedlib.reporting.results import canonical_json, config_hash

    now = hashed(cells)
    by_hash = {config_hash(c): c for c in cells}
    frozen_keys, now_keys = [p[0] for p in frozen], [p[0] for p in now]
    appeared = [p for p in now if p[0] not in set(frozen_keys)]
    disappeared = [p for p in frozen if p[0] not in set(now_keys)]
    lines = [f"{paper} `{command}`: {len(now)} cells now, {len(frozen)} frozen; "
             f"{len(appeared)} appeared, {len(disappeared)} disappeared"]
    if not appeared and not disappeared:
        first = next(i for i, (a, b) in enumerate(zip(frozen_keys, now_keys)) if a != b)
        lines.append(f"  same cells in another order (first difference at position {first}: "
                     f"frozen {frozen[first][1]!r}, now {now[first][1]!r})")
    if appeared:
        lines.append(f"  appeared, e.g. {appeared[0][1]!r}: {canonical_json(by_hash[appeared[0][0]])}")
    if disappeared:
        old = configs.get(disappeared[0][0])
        lines.append(f"  disappeared, e.g. {disappeared[0][1]!r}: {json.dumps(old, sort_keys=True)}")
        same_label = next((p for p in appeared if p[1] == disappeared[0][1]), None)
        if old is not None and same_label is not None:
            lines.append(f"  the cell with that label changed: {_config_difference(old, by_hash[same_label[0]])}")
    return "\n".join(lines)


@pytest.mark.parametrize("paper", PAPERS)
def test_grid_specification_frozen(paper):
    """Every part's cells (default options, and every dataset the specification knows) hash as frozen, in order."""
    frozen = read_frozen("grid_cells.json")[paper]
    configs = read_frozen("grid_configs.json")
    current = cells_by_command(paper, with_seed_runs=False)
    assert set(current) == set(frozen), (
        f"{paper}: command lines now {sorted(current)}, frozen {sorted(frozen)} (a part or dataset was added or "
        f"removed); {REFREEZE_HINT}")
    changed = [describe_grid_change(paper, command, frozen[command], cells, configs)
               for command, cells in current.items()
               if [p[0] for p in hashed(cells)] != [p[0] for p in frozen[command]]]
    assert not changed, "\n".join(changed) + f"\n{REFREEZE_HINT}"


# ======================================================================================
# 2. Every record is a grid cell
# ======================================================================================
def statistics_configs(paper: str) -> List[Dict[str, Any]]:
    from fedlib.experiments.grid import statistics_config

    if paper == "f3crec":  # papers.f3crec.tables.data_statistics_records: block statistics of the continual stream
        return [{"paper": paper, "kind": "data_blocks", "dataset": d, "seed": 0} for d in STATISTICS_DATASETS[paper]]
    return [statistics_config(paper, d) for d in STATISTICS_DATASETS[paper]]


def classify_records(paper: str) -> Dict[str, List[Any]]:
    """Each line of ``results/<paper>/runs.jsonl`` in one category (see the module docstring).

    * ``grid cell``: its config hash is a cell of some command line (seed runs included);
    * ``data statistics``: a dataset's statistics, recorded by ``write_tables`` for Table 1 (not trained);
    * ``older version``: recorded under an older config ``version``; the same config at the current
      version (the paper's, or a later one its spec's ``[versions]`` gives the moved cells) is a
      grid cell (the record is kept, labelled by its version);
    * ``known orphan``: listed in ``known_orphans.json`` with the reason it is no grid cell;
    * ``unexplained``: none of these (must stay empty).
    """
    from fedlib.reporting import read_runs
    from fedlib.reporting.results import config_hash

    version = getattr(paper_module(paper), "VERSION")
    # Cells moved by a change that moved only them carry a later version ([versions] of the spec).
    later_versions = sorted({version, *getattr(paper_module(paper), "SPEC").data.get("versions", {}).values()})
    cells = {config_hash(c) for cells in cells_by_command(paper, with_seed_runs=True).values() for c in cells}
    statistics = {config_hash(c) for c in statistics_configs(paper)}
    orphans = read_frozen("known_orphans.json").get(paper, {})
    out: Dict[str, List[Any]] = {k: [] for k in ("grid cell", "data statistics", "older version", "known orphan",
                                                 "unexplained")}
    for record in read_runs(paper, "paper"):
        config = record.config
        if record.config_hash in cells:
            out["grid cell"].append(record)
        elif record.config_hash in statistics:
            out["data statistics"].append(record)
        elif (isinstance(config.get("version"), int)
              and any(config_hash({**config, "version": later}) in cells
                      for later in later_versions if later > config["version"])):
            out["older version"].append(record)
        elif record.config_hash in orphans:
            out["known orphan"].append(record)
        else:
            out["unexplained"].append(record)
    return out


@pytest.mark.parametrize("paper", PAPERS)
def test_every_record_is_a_grid_cell(paper):
    from fedlib.reporting.results import canonical_json

    found = classify_records(paper)
    unexplained = found.pop("unexplained")
    assert not unexplained, (
        f"{len(unexplained)} record(s) of results/{paper}/runs.jsonl match no cell of the current specification "
        f"(with the seeds of SEED_RUNS), no statistics config and no older version of a cell, e.g. "
        f"{unexplained[0].config_hash} (seed {unexplained[0].seed}, commit {unexplained[0].commit}): "
        f"{canonical_json(unexplained[0].config)}. Either the change altered a recorded cell's config (then old "
        f"records and tables lose it: restore the config, or bump the paper's VERSION for a change that moves its "
        f"numbers), or the record really left the grid: add it to tests/frozen/known_orphans.json with the reason")
    orphans = read_frozen("known_orphans.json").get(paper, {})
    recorded = {r.config_hash for rs in found.values() for r in rs}
    stale = sorted(set(orphans) - {r.config_hash for r in found["known orphan"]})
    assert not stale, (f"{paper}: known orphans {stale} are no longer orphans (a grid cell again, or no longer in "
                       f"runs.jsonl: {[h in recorded for h in stale]}); remove them from known_orphans.json")
    counts = {category: len(records) for category, records in found.items()}
    counts["lines"] = sum(counts.values())
    seen, reruns = set(), 0
    for record in found["grid cell"]:
        reruns += record.config_hash in seen
        seen.add(record.config_hash)
    counts["re-runs"] = reruns
    assert counts == EXPECTED_RECORD_COUNTS[paper], (
        f"{paper}: records per category {counts}, expected {EXPECTED_RECORD_COUNTS[paper]}; a record that moved "
        f"category was dropped or gained silently (new runs appended on purpose: update EXPECTED_RECORD_COUNTS)")


# ======================================================================================
# 3. Pending
# ======================================================================================
@pytest.mark.parametrize("paper", PAPERS)
def test_pending_frozen(paper, monkeypatch):
    """``--pending`` of every command line lists exactly the frozen cells (download-only datasets included)."""
    import fedlib.reporting

    # pending_cells reads runs.jsonl on every call (FedRKG's is 15 MB, read once per command line):
    # the file does not change during the test, so one read per paper serves them all
    monkeypatch.setattr(fedlib.reporting, "read_runs", functools.lru_cache(maxsize=None)(fedlib.reporting.read_runs))
    frozen = read_frozen("pending.json")[paper]
    current = pending_by_command(paper)
    assert set(current) == set(frozen), f"{paper}: command lines now {sorted(current)}, frozen {sorted(frozen)}"
    problems = []
    for command, pairs in current.items():
        now, before = {p[0]: p[1] for p in pairs}, {p[0]: p[1] for p in frozen[command]}
        if set(now) != set(before):
            newly = [label for key, label in now.items() if key not in before]
            gone = [label for key, label in before.items() if key not in now]
            problems.append(f"{paper} `{command} --pending`: {len(now)} pending now, {len(before)} frozen; "
                            f"newly pending {len(newly)} (e.g. {newly[:2]}), no longer pending {len(gone)} "
                            f"(e.g. {gone[:2]})")
    assert not problems, "\n".join(problems) + (
        "\nA cell no longer pending was recorded (runs appended: refreeze and say so) or left the grid; a newly "
        "pending cell changed its config (its records no longer match it) or was added. " + REFREEZE_HINT)


# ======================================================================================
# 4. Tables rebuild byte-identical
# ======================================================================================
@pytest.mark.parametrize("paper", PAPERS)
def test_tables_rebuild_byte_identical(paper, tmp_path, monkeypatch, request):
    """``write_tables("paper")`` on a copy of the records rewrites every committed CSV byte for byte."""
    import fedlib.reporting.results as results_module
    from fedlib.paths import project_root

    frozen = read_frozen("tables.json")
    committed = committed_csvs(paper)
    changed = {name: path for name, path in committed.items()
               if sha256(path) != frozen["csv_sha256"][paper].get(name)}
    assert set(committed) == set(frozen["csv_sha256"][paper]) and not changed, (
        f"results/{paper}/: CSVs now {sorted(committed)}, frozen {sorted(frozen['csv_sha256'][paper])}; changed since "
        f"the freeze: {sorted(changed)}. Recorded tables are not rewritten by a refactor; {REFREEZE_HINT}")

    source = project_root()
    root = tmp_path / "root"
    (root / "results" / paper).mkdir(parents=True)
    for path in (source / "results" / paper).iterdir():
        if path.is_file():  # runs.jsonl and the CSVs; the quick/smoke folders are not read
            shutil.copy2(path, root / "results" / paper / path.name)
    shutil.copytree(source / "paper_tables", root / "paper_tables")
    monkeypatch.setenv("FEDLIB_PROJECT_ROOT", str(root))
    monkeypatch.setenv("FEDLIB_OFFLINE", "1")
    exception = frozen["known_exceptions"].get(paper, {})
    writer_commit = exception.get("writer_commit")

    def commit_of_the_writing_checkout(*args, **kwargs):
        if writer_commit is None:
            raise AssertionError(f"{paper}'s tables asked for the commit of the checkout writing them: a table must "
                                 "be a function of the records (or list the writer commit in tables.json)")
        return writer_commit

    monkeypatch.setattr(results_module, "current_commit", commit_of_the_writing_checkout)

    module = tables_module(paper)
    if paper in TABLES_NEED_DATA:
        from fedlib.data.errors import MissingDataError

        shared = request.getfixturevalue("shared_data")
        monkeypatch.setenv("FEDLIB_DATA", str(shared))
        try:
            module.write_tables("paper", **WRITE_TABLES_KWARGS.get(paper, {}))
        except MissingDataError as error:
            missing_data(f"{paper}'s write_tables needs its datasets: {error}")
    else:
        module.write_tables("paper", **WRITE_TABLES_KWARGS.get(paper, {}))

    rebuilt = {path.name for path in (root / "results" / paper).glob("*.csv")}
    assert rebuilt == set(committed), (f"write_tables wrote {sorted(rebuilt - set(committed))} beyond the committed "
                                       f"CSVs and left {sorted(set(committed) - rebuilt)} unwritten")
    assert filecmp.cmp(source / "results" / paper / "runs.jsonl", root / "results" / paper / "runs.jsonl",
                       shallow=False), (f"write_tables appended to {paper}'s runs.jsonl "
                                        "(its statistics records are recorded already)")
    assert not (root / "figures").exists(), "write_tables drew figures: it should only write results tables"
    different = [name for name, path in committed.items()
                 if not filecmp.cmp(path, root / "results" / paper / name, shallow=False)]
    # Cells moved to a later version ([versions] of the spec) await their re-run: their rows in the
    # committed tables hold the older version's values, which the rebuild (at the new version) no
    # longer finds. Those rows, and only those, may differ (tables.json names them and why).
    awaiting = exception.get("awaiting_rerun", {})
    for name in [name for name in different if name in awaiting.get("files", ())]:
        old = committed[name].read_text(encoding="utf-8").splitlines()
        new = (root / "results" / paper / name).read_text(encoding="utf-8").splitlines()
        moved = [a for a, b in zip(old, new) if a != b]
        outside = [a for a in moved if not re.search(awaiting["rows_matching"], a)]
        assert len(old) == len(new) and not outside, (
            f"{paper}/{name}: rows beyond the cells awaiting a re-run ({awaiting['rows_matching']!r}) differ "
            f"({len(old)} lines committed, {len(new)} rebuilt), e.g. {outside[:1]}")
        different.remove(name)
    diffs = []
    for name in different[:3]:
        old = committed[name].read_text(encoding="utf-8").splitlines()
        new = (root / "results" / paper / name).read_text(encoding="utf-8").splitlines()
        row = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        diffs.append(f"{name}: {len(old)} lines committed, {len(new)} rebuilt; first difference at line {row + 1}:\n"
                     f"  committed: {old[row] if row < len(old) else '(end)'}\n"
                     f"  rebuilt:   {new[row] if row < len(new) else '(end)'}")
    assert not different, (f"{paper}: {len(different)} of {len(committed)} tables differ from the committed files "
                           f"({different})\n" + "\n".join(diffs))

