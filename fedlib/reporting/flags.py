"""The flags of a recorded results row: how much a value of ours can be trusted, read from its runs.

A value in ``results/<paper>/*.csv`` is a seed mean over recorded runs. Each flag names a reason
to read it with care; the ``flags`` column lists them (``;``-joined, in :data:`FLAG_ORDER`), and
the lessons show them as superscript marks with a legend
(:func:`~fedlib.reporting.display.paper_grid`). One definition for every paper, applied when a
table is written (:func:`~fedlib.reporting.results_tables.write_results_table`) and again when a
lesson reads it (:func:`~fedlib.reporting.recorded.with_flags`).

Which runs are exempt from ``at_cap`` and which settings were tuned differ per paper: they are
a :class:`FlagRules` (each paper's ``[report.flags]`` in its ``spec.toml``).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from fedlib.reporting.results import RUN_ID_SEPARATOR, config_hash, latest_records

__all__ = ["FLAG_ORDER", "FlagRules", "run_flags", "row_flags", "add_flags", "merge_flags"]

FLAG_ORDER = ("substitute", "one_seed", "diverged", "at_cap", "grid_edge", "dirty")
"""The flags a row of ours may carry, in the order they are listed (``;``-joined):

* ``substitute``: the row's note says ``SUBSTITUTE`` (substitute data or split);
* ``one_seed``: one seed stands behind the value (``n_seeds == 1``);
* ``diverged``: a run ended on a NaN loss (``extra["diverged_at_round"]``; its best finite evaluation counts);
* ``at_cap``: a run selected its last allowed round (its selected round, recorded as
  ``metrics["best_round"]`` or ``metrics["selected_round"]``, equals ``config["rounds"]``): it may
  still have been improving;
* ``grid_edge``: a tuned setting of a run (:attr:`FlagRules.tuned`) has the smallest or the
  largest of the values tried for that cell: the best value may lie beyond the grid;
* ``dirty``: a run was recorded from a tree with uncommitted changes (commit ``...+dirty``), so
  the exact code behind it cannot be recovered.

A row without a value of ours carries no flag."""


@dataclasses.dataclass(frozen=True)
class FlagRules:
    """What a paper says about its runs for :func:`row_flags`.

    Attributes:
        at_cap_exempt: config key -> values whose runs are never ``at_cap``, e.g.
            ``{"method": ["Centralized"]}`` (trained for a fixed number of epochs, not rounds).
        tuned: the settings chosen on validation, as config keys (``"lr"``) or dotted paths into
            nested configs (``"method_params.beta"``). The values *tried* for a run's setting
            are those of the recorded runs whose configs equal the run's on every other key
            (any seed); with two or more of them, a run at the smallest or the largest is
            ``grid_edge``.
        grids: for tuning that does not vary one cell's setting (a sweep around other defaults,
            whose winners are then combined): config -> ``{path: values tried}``; these grids
            replace the neighbours' values for the paths they name.
    """

    at_cap_exempt: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)
    tuned: Sequence[str] = ()
    grids: Optional[Callable[[Mapping[str, Any]], Mapping[str, Sequence[Any]]]] = None

    def __post_init__(self):
        if not isinstance(self.at_cap_exempt, Mapping) or any(isinstance(v, str) for v in self.at_cap_exempt.values()):
            raise TypeError(f"at_cap_exempt maps a config key to a list of values, e.g. {{'method': ['Centralized']}}; "
                            f"got {self.at_cap_exempt!r}")
        if isinstance(self.tuned, str) or not all(isinstance(p, str) and p for p in self.tuned):
            raise TypeError(f"tuned is a list of config keys or dotted paths, e.g. ['lr']; got {self.tuned!r}")

    @classmethod
    def from_spec(cls, section: Mapping[str, Any]) -> "FlagRules":
        """From a spec's ``[report.flags]`` (``at_cap_exempt``, ``tuned``); unknown keys are an error."""
        unknown = set(section) - {"at_cap_exempt", "tuned"}
        if unknown:
            raise ValueError(f"[report.flags]: unknown key {sorted(unknown)[0]!r}; it takes 'at_cap_exempt' and 'tuned'")
        return cls(at_cap_exempt=dict(section.get("at_cap_exempt", {})), tuned=tuple(section.get("tuned", ())))


_MISSING = object()


def _get(config: Mapping[str, Any], path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _without(config: Mapping[str, Any], path: str) -> Dict[str, Any]:
    """``config`` without ``seed`` and without the setting at ``path`` (a deep copy)."""
    out = copy.deepcopy(dict(config))
    out.pop("seed", None)
    *parents, last = path.split(".")
    inner: Any = out
    for part in parents:
        inner = inner.get(part) if isinstance(inner, dict) else None
    if isinstance(inner, dict):
        inner.pop(last, None)
    return out


def _selected_round(metrics: Mapping[str, Any]) -> Any:
    """The round a run selected: ``best_round`` (parameter averaging) or ``selected_round`` (the
    cross-domain and sequential families); ``None`` for a run without rounds."""
    return metrics.get("best_round", metrics.get("selected_round"))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Tried:
    """Per tuned path, the values tried for each cell (the runs' configs with that path left out)."""

    def __init__(self, records: Iterable[Any], rules: FlagRules):
        self.rules = rules
        self.values: Dict[Tuple[str, str], set] = {}
        for record in records:
            config = getattr(record, "config", None)
            if not isinstance(config, Mapping):
                continue
            for path in rules.tuned:
                value = _get(config, path)
                if _is_number(value):
                    self.values.setdefault((path, config_hash(_without(config, path))), set()).add(float(value))

    def at_edge(self, config: Mapping[str, Any]) -> bool:
        explicit = dict(self.rules.grids(config)) if self.rules.grids is not None else {}
        for path in self.rules.tuned:
            value = _get(config, path)
            if not _is_number(value):
                continue
            tried = ({float(v) for v in explicit[path]} if path in explicit
                     else self.values.get((path, config_hash(_without(config, path))), set()))
            if len(tried) >= 2 and float(value) in (min(tried), max(tried)):
                return True
        return False


def run_flags(record: Any, rules: FlagRules, tried: Optional[_Tried] = None) -> List[str]:
    """The run-level flags of one record (``diverged``, ``at_cap``, ``grid_edge``, ``dirty``)."""
    config = record.config if isinstance(record.config, Mapping) else {}
    metrics = record.metrics if isinstance(record.metrics, Mapping) else {}
    selected = _selected_round(metrics)
    exempt = any(config.get(key) in values for key, values in rules.at_cap_exempt.items())
    on = {"diverged": (getattr(record, "extra", None) or {}).get("diverged_at_round") is not None,
          "at_cap": selected is not None and selected == config.get("rounds") and not exempt,
          "grid_edge": tried is not None and tried.at_edge(config),
          "dirty": str(getattr(record, "commit", "")).endswith("+dirty")}
    return [flag for flag in FLAG_ORDER if on.get(flag)]


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def merge_flags(*lists: Iterable[str]) -> str:
    """The union of flag lists (or ``;``-joined strings), in :data:`FLAG_ORDER` (unknown flags last)."""
    found: List[str] = []
    for flags in lists:
        # a list of flags, or a ";"-joined string (a CSV cell read as NaN when empty)
        items = list(flags) if isinstance(flags, (list, tuple, set)) else _text(flags).split(";")
        found.extend(f for f in items if f and f not in found)
    known = [f for f in FLAG_ORDER if f in found]
    return ";".join(known + [f for f in found if f not in FLAG_ORDER])


def row_flags(frame: pd.DataFrame, records: Iterable[Any] = (), rules: FlagRules = FlagRules()) -> List[str]:
    """One ``;``-joined flag string per row of ``frame`` (:data:`FLAG_ORDER`).

    ``frame``: rows with ``value_ours`` and optionally ``n_seeds``, ``note``, ``commit`` and
    ``run_ids`` (run config hashes joined by ``;``); an absent column raises no flag.
    ``records``: the paper's run records (every profile's runs that ``run_ids`` may name); the
    run-level flags and the grids of ``grid_edge`` are read from them.
    """
    records = list(records)
    known = latest_records(records)
    tried = _Tried(known.values(), rules) if rules.tuned else None
    column = lambda name, fill: frame[name] if name in frame.columns else pd.Series(fill, index=frame.index)
    cache: Dict[str, List[str]] = {}
    out = []
    for value, seeds, note, commit, run_ids in zip(column("value_ours", math.nan), column("n_seeds", 0),
                                                   column("note", ""), column("commit", ""), column("run_ids", "")):
        if _text(value) == "":
            out.append("")
            continue
        runs = [known[h] for h in _text(run_ids).split(RUN_ID_SEPARATOR) if h in known]
        from_runs = []
        for run in runs:
            if run.config_hash not in cache:
                cache[run.config_hash] = run_flags(run, rules, tried)
            from_runs += cache[run.config_hash]
        own = [flag for flag, on in (("substitute", "SUBSTITUTE" in _text(note)),
                                     ("one_seed", _text(seeds) != "" and int(float(seeds)) == 1),
                                     ("dirty", any(c.endswith("+dirty") for c in _text(commit).split(RUN_ID_SEPARATOR))))
               if on]
        out.append(merge_flags(own, from_runs))
    return out


def add_flags(frame: pd.DataFrame, records: Iterable[Any] = (), rules: FlagRules = FlagRules()) -> pd.DataFrame:
    """``frame`` with its ``flags`` column: the flags it already carries (a written table's, e.g.
    ``grid_edge`` from its paper's rules) united with those :func:`row_flags` finds now."""
    found = row_flags(frame, records, rules)
    before = frame["flags"] if "flags" in frame.columns else pd.Series("", index=frame.index)
    return frame.assign(flags=[merge_flags(old, new) if _text(v) != "" else ""
                               for old, new, v in zip(before, found, frame.get("value_ours", pd.Series(math.nan, index=frame.index)))])
