"""Experiments as data: a paper's grid and its tables' layouts, read by one grid runner and one table builder.

Each paper declares, in ``fedlib/papers/<paper>/spec.toml``, what its cells are and how
its tables are laid out; this module expands them. The paper's Python keeps only what is
logic (its cell builder's derived values, training a cell, derived table rows).

Why TOML and not dataclasses: the specification is read by people checking a reproduction
("which ε did Table 8 use, and why?"), so it should hold values and the comments that justify
them, and nothing else; TOML keeps ``1`` (int) and ``1.0`` (float) apart, which the config
hash needs; it is in the standard library (``tomllib``); and a file cannot quietly grow logic.
What must be logic is a named Python function of the paper module (``derive``, ``finish``).

The file, section by section:

* ``paper``, ``version``: added to every cell config (bump ``version`` when a cell's numbers move).
* ``[versions]``: a later version for the cells a change moved when it moved only some of them:
  ``upload_noise = 2`` gives version 2 to every cell whose ``upload_noise`` is set (not ``None``,
  zero, ``false`` or empty) and leaves the others at ``version``, so their hashes and records
  still match while the moved cells' old records stay, labelled by their older version
  (:meth:`Spec.cell_version`; a builder that adds such a key after :meth:`Spec.config` calls it).
* ``[options]``: the runtime options a part may take (``datasets = "@offline_datasets"``: the
  default of ``--datasets``); a block refers to one as ``"$datasets"``.
* ``[lists]``: named value lists, referred to as ``"@name"``.
* ``[choices.<key>.<name>]``: the valid values of a config key and their attributes;
  ``"@<key>"`` lists the names, ``"@<key>.<attribute>"`` is the chosen value's attribute.
  The attribute ``cell`` (a table) holds config keys of the cells of that choice only: a key
  of ``[cell]`` takes this default instead, a new key follows the ``[cell]`` keys (a method's
  own hyperparameters, which the other methods' configs do not carry).
* ``[cell]``: every other config key with its default, written once; its TOML type is the
  config's type (an override is cast to it). ``"@dataset"`` marks a required choice.
  ``{ none = "float" }`` (or ``"int"``, ``"str"``, ``"bool"``) is a default of ``None``, which
  TOML cannot write; a given value is cast to that type.
* ``[parts.<part>]``: ``doc`` and ``[[parts.<part>.blocks]]``, expanded in order. A block is the
  keywords of the paper's cell builder: a scalar or inline table is fixed, an array (or an
  ``"@list"`` / ``"$option"``) is an axis; axes nest in file order, the first outermost.
  ``only = {dataset = "@list"}`` keeps an axis's values that are in the list; ``sweep = [...]``
  is an axis of one-at-a-time sweeps, each entry ``{param, values, times?, label?, ...}``
  giving ``params = {param: value × times}`` plus its other keys; ``cases = [{...}, ...]`` (or
  an ``"@list"`` of inline tables) is an axis whose values are sets of keywords, for settings
  that vary together (``{ method = "FedRKG", guidance = "fixed" }``, ``{ method = "FedRAP" }``; in a
  table's rows a case may carry its own ``columns`` over its block's: write such cases as an
  ``"@list"``, so that their column references are resolved per row);
  ``part = "<other>"`` makes the block another part's cells.
* ``[report]``: ``available``, the datasets that can be run offline (a row of another
  dataset without our value is noted "needs download", see :func:`compare`).
* ``[tables.<id>]``: ``keys`` (the paper table's key columns), ``metrics`` (a pattern such as
  ``"{metric}/{block}"`` over the recorded metric names, each field's allowed values as a list
  or as a mapping recorded -> shown), ``[[tables.<id>.rows]]`` (blocks as above: one table row
  group per cell), ``columns`` (constant or formatted key columns, ``"noise lambda={upload_noise:g}"``,
  or ``"@task.paper_task"``: an attribute of the row's choice; a row block's own ``columns``
  override the table's for its rows; a column that is not one of ``keys`` rides along with the
  row, e.g. its ``note``; a ``dataset`` column ``"@dataset.<attribute>"`` also names the datasets
  for :func:`compare`'s checks), the names of the paper's ``derive`` (rows computed before
  the comparison) and ``finish`` (after it) functions, and two options of :func:`compare`:
  ``repeat_paper = { sampler = "$samplers" }`` (the paper's rows once per value of a key column
  the paper lacks, e.g. our two negative samplers beside one paper value) and
  ``unmatched_in_paper_unit = true`` (our rows without a paper value shown in the paper's percent).
  ``like = "<other table>"`` takes the other table's layout, its own keys replacing the other's
  (a paper table that is a subset of another: same rows, another paper table).

  Three more table options, for paper tables whose rows differ by a setting of ours:

  * a column format may read the row's cell config: ``dim = "{cell[dim]}"`` is the size the cell
    was built with (a profile's keywords may override the block's ``dim``); two row groups that
    build the same cell are one row group, with the later one's columns (its note);
  * ``repeat_paper = { dim = { by = ["method"], mark = "repeats_paper_value" } }``: each paper row
    once per distinct value of ``dim`` among the table's row groups that share its ``by`` columns
    (in row order; a paper row no row group shares them with is kept once, ``dim`` empty), the
    copies after the first with ``mark`` true, so that a status counts the paper cell once
    (FedCSR at n = 256 and 64 beside the paper's one FedCSR row, each baseline at its own size);
  * ``skeleton = { domain = "@dataset.domains", unit = "percent" }``: a table of ours only (no
    ``paper_tables`` file): its expected rows are the row groups × the values of the metric
    pattern's fields (a field's list in ``metrics``, else the reference here, resolved with the
    row's choices), each in ``unit`` (default percent), with an empty paper value.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
import tomllib
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

__all__ = ["SpecError", "Spec", "load_spec", "TableContext", "derived_row", "DERIVED", "metric_units", "compare",
           "build_table", "unique_row_groups", "repeat_per_rows", "skeleton"]

#: The papers' folders; paper ``<slug>`` keeps its specification in ``<slug>/spec.toml`` (read as a file, not imported).
PAPERS_DIR = Path(__file__).resolve().parents[1] / "papers"
SECTIONS = {"paper", "version", "versions", "options", "lists", "choices", "cell", "parts", "tables", "report", "selected"}
BLOCK_DIRECTIVES = {"only", "sweep", "part", "cases", "columns"}
TABLE_KEYS = {"doc", "keys", "metrics", "rows", "columns", "derive", "finish", "repeat_paper",
              "unmatched_in_paper_unit", "skeleton"}
#: The keys of a ``repeat_paper`` entry that repeats the paper rows per value of our row groups.
REPEAT_BY_ROWS = {"by", "mark"}
#: Where a table row block's own ``columns`` travel with its keywords (never handed to the builder).
ROW_COLUMNS = "__columns"
#: ``{ none = "<type>" }`` in ``[cell]``: a ``None`` default; a given value is cast with this type.
OPTIONAL_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
#: The ``note`` prefix of a table row computed from other rows (its ``run_metric`` is empty).
DERIVED = "derived"


class SpecError(ValueError):
    """A malformed specification: the message names the file, the section and the key."""


def _fail(path: Path, where: str, message: str) -> SpecError:
    return SpecError(f"{path.name}: [{where}] {message}")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A paper's specification as read from its TOML file (see the module docstring)."""

    path: Path
    data: Mapping[str, Any]

    # ----------------------------------------------------------------------------------
    # Names
    # ----------------------------------------------------------------------------------
    @property
    def paper(self) -> str:
        return self.data["paper"]

    @property
    def version(self) -> int:
        return self.data["version"]

    def cell_version(self, config: Mapping[str, Any]) -> int:
        """The version of the cell ``config``: ``version``, or the largest ``[versions]`` entry
        whose key the cell sets (a value that is not ``None``, zero, ``false`` or empty).

        Example (F3CRec): ``[versions] upload_noise = 2`` (the counter-based upload noise moved
        the noisy Table 8 cells only): a cell with ``upload_noise = 0.1`` is version 2, one with
        ``0.0`` keeps version 1 and its hash.
        """
        version = self.version
        for key, later in self.data.get("versions", {}).items():
            if config.get(key) not in (None, 0, 0.0, False, "", {}, []):
                version = max(version, later)
        return version

    @property
    def parts(self) -> Tuple[str, ...]:
        return tuple(self.data.get("parts", {}))

    def choices(self, key: str) -> Dict[str, Mapping[str, Any]]:
        """``{name: attributes}`` of the config key ``key`` (``"dataset"``), in file order."""
        return self.data.get("choices", {}).get(key, {})

    def choice(self, key: str, name: str) -> Mapping[str, Any]:
        """The attributes of ``name``; a clear error naming the valid choices when it is not one."""
        table = self.choices(key)
        if name not in table:
            raise ValueError(f"unknown {key} {name!r}; expected one of {list(table)}")
        return table[name]

    def list(self, name: str) -> List[Any]:
        """The named list ``name`` (``[lists]``) or the names of the choices of config key ``name``."""
        if name in self.data.get("lists", {}):
            return list(self.data["lists"][name])
        if name in self.data.get("choices", {}):
            return list(self.choices(name))
        raise KeyError(name)

    # ----------------------------------------------------------------------------------
    # Values
    # ----------------------------------------------------------------------------------
    def resolve(self, value: Any, chosen: Mapping[str, Any], options: Mapping[str, Any] = {}) -> Any:
        """``value`` with its references replaced: ``"@list"``, ``"@key.attribute"`` of the
        ``chosen`` value of ``key``, ``"$option"``; inline tables and arrays recursively."""
        if isinstance(value, dict):
            return {k: self.resolve(v, chosen, options) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, chosen, options) for v in value]
        if not isinstance(value, str) or value[:1] not in "@$" or not value:
            return value
        if value[0] == "$":
            return list(options[value[1:]])
        name, _, attribute = value[1:].partition(".")
        if not attribute:
            return self.list(name)
        return self.choice(name, chosen[name])[attribute]

    def config(self, chosen: Mapping[str, Any], settings: Mapping[str, Any]) -> Dict[str, Any]:
        """One cell's config: ``paper``, ``version`` and every ``[cell]`` key.

        ``chosen``: the required choices (``{"dataset": "ML-100K", ...}``), checked against
        ``[choices]``. ``settings``: overrides of the other keys; ``None`` keeps the default,
        a value is cast to the default's type (``rounds=100.0`` -> ``100``). An unknown
        setting is a ``TypeError`` naming the known ones.
        """
        template = self._template(chosen)  # raises on an unknown choice
        unknown = set(settings) - set(template)
        if unknown:
            raise TypeError(f"unknown cell setting(s) {sorted(unknown)}; the settings of a {self.paper} cell are "
                            f"{[k for k, v in template.items() if not _is_choice(v)]}")
        out: Dict[str, Any] = {"paper": self.paper, "version": self.version}
        for key, default in template.items():
            if _is_choice(default):
                out[key] = chosen[key]
                continue
            default = self.resolve(default, chosen)
            given = settings.get(key)
            if _is_optional(default):
                out[key] = None if given is None else OPTIONAL_TYPES[default["none"]](given)
            elif given is None:
                out[key] = dict(default) if isinstance(default, dict) else default
            else:
                out[key] = dict(given) if isinstance(default, dict) else type(default)(given)
        out["version"] = self.cell_version(out)
        return out

    def _template(self, chosen: Mapping[str, Any]) -> Dict[str, Any]:
        """``[cell]`` with the chosen choices' own ``cell`` keys (a new default keeps its place, a new key follows)."""
        template = dict(self.data["cell"])
        for key, value in self.data["cell"].items():
            if _is_choice(value):
                template.update(self.choice(key, chosen[key]).get("cell", {}))
        return template

    def cell_keys(self) -> set:
        """Every config key a cell may set: ``[cell]``'s and those of every choice's ``cell`` table."""
        own = {k for choices in self.data.get("choices", {}).values() for c in choices.values() for k in c.get("cell", {})}
        return set(self.data["cell"]) | own

    # ----------------------------------------------------------------------------------
    # Blocks: parts and table rows
    # ----------------------------------------------------------------------------------
    def expand(self, blocks: Sequence[Mapping[str, Any]], options: Mapping[str, Any], where: str,
               ) -> Iterator[Dict[str, Any]]:
        """The builder keywords of every cell of ``blocks``, in order (axes nest in file order)."""
        for number, block in enumerate(blocks):
            if "part" in block:
                yield from self.expand(self.data["parts"][block["part"]]["blocks"], options, f"parts.{block['part']}")
                continue
            axes: List[List[Dict[str, Any]]] = []
            only = block.get("only", {})
            for key, value in block.items():
                if key in ("only", "part"):
                    continue
                if key == "sweep":
                    axes.append(list(self._sweep_values(value)))
                    continue
                if key == "cases":
                    axes.append([_case_columns(case) for case in self.resolve(value, {}, options)])
                    continue
                if key == "columns":
                    axes.append([{ROW_COLUMNS: value}])
                    continue
                resolved = self.resolve(value, {}, options) if isinstance(value, str) else value
                if isinstance(resolved, list):
                    if key in only:
                        allowed = self.resolve(only[key], {}, options)
                        resolved = [v for v in resolved if v in allowed]
                    axes.append([{key: v} for v in resolved])
                else:
                    axes.append([{key: resolved}])
            for combination in itertools.product(*axes):
                keywords: Dict[str, Any] = {}
                for part in combination:
                    columns = {**keywords.get(ROW_COLUMNS, {}), **part.get(ROW_COLUMNS, {})}
                    keywords.update(part)
                    if columns:  # a case's own columns override its block's
                        keywords[ROW_COLUMNS] = columns
                yield self._finish_sweep(keywords)

    def _sweep_values(self, entries: Sequence[Mapping[str, Any]]) -> Iterator[Dict[str, Any]]:
        for entry in entries:
            fixed = {k: v for k, v in entry.items() if k not in ("param", "values", "times", "label")}
            for value in self.resolve(entry["values"], {}):
                yield {**fixed, "__sweep": (entry["param"], value, entry.get("times"), entry.get("label"))}

    def _finish_sweep(self, keywords: Dict[str, Any]) -> Dict[str, Any]:
        """Turn a sweep point into ``params`` (``times`` refers to a choice made by the same cell)."""
        if "__sweep" not in keywords:
            return keywords
        param, value, times, label = keywords.pop("__sweep")
        scaled = value * self.resolve(times, keywords) if times is not None else value
        keywords["params"] = {param: scaled}
        keywords["sweep"] = {"param": param, "label": label or param, "value": scaled}
        return keywords

    def cells(self, part: str, builder: Callable[..., Dict[str, Any]], options: Mapping[str, Any] = {},
              **fixed) -> List[Dict[str, Any]]:
        """The configs of ``part``: ``builder(**keywords, **fixed)`` for each cell, in order.

        ``options``: the part's runtime options (missing ones take ``[options]``'s defaults).
        ``fixed``: keywords every cell gets (``rounds=``, ``seed=``), overriding the spec's.
        """
        return [config for _, config in self.labelled_cells(part, builder, options, **fixed)]

    def labelled_cells(self, part: str, builder: Callable[..., Dict[str, Any]], options: Mapping[str, Any] = {},
                       **fixed) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
        """``(keywords, config)`` of every cell of ``part``; a sweep cell's keywords hold ``sweep``."""
        if part not in self.parts:
            raise ValueError(f"unknown part {part!r}; expected one of {self.parts}")
        return self._build(self.data["parts"][part]["blocks"], builder, options, f"parts.{part}", fixed)

    def _build(self, blocks, builder, options, where, fixed) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
        options = {**self._default_options(), **{k: v for k, v in options.items() if v is not None}}
        accepted = _keywords(builder, self.cell_keys())
        out = []
        for keywords in self.expand(blocks, options, where):
            arguments = {k: v for k, v in keywords.items() if k not in ("sweep", ROW_COLUMNS)}
            unknown = sorted(set(arguments) - accepted)
            if unknown:
                raise _fail(self.path, where, f"key {unknown[0]!r} is not a keyword of "
                                              f"{builder.__name__}(); its keywords are {sorted(accepted)}")
            out.append((keywords, builder(**{**arguments, **fixed})))
        return out

    def _default_options(self) -> Dict[str, Any]:
        return {k: self.resolve(v, {}) for k, v in self.data.get("options", {}).items()}

    # ----------------------------------------------------------------------------------
    # Tables
    # ----------------------------------------------------------------------------------
    def flag_rules(self):
        """The paper's :class:`~fedlib.reporting.flags.FlagRules` from ``[report.flags]``
        (``at_cap_exempt``, ``tuned``; none given: no exemption, nothing tuned)."""
        from fedlib.reporting.flags import FlagRules

        try:
            return FlagRules.from_spec(self.data.get("report", {}).get("flags", {}))
        except (TypeError, ValueError) as error:
            raise _fail(self.path, "report.flags", str(error)) from None

    def table(self, table_id: str) -> Mapping[str, Any]:
        if table_id not in self.data.get("tables", {}):
            raise ValueError(f"unknown table {table_id!r}; {self.path.name} lays out "
                             f"{list(self.data.get('tables', {}))}")
        return self.data["tables"][table_id]

    def table_rows(self, table_id: str, builder: Callable[..., Dict[str, Any]], options: Mapping[str, Any],
                   **fixed) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
        """``(key columns, cell config)`` of every row group of ``table_id`` (:func:`cell_index`'s pairs)."""
        layout = self.table(table_id)
        names = [k for k in layout["keys"] if k not in _pattern_fields(layout["metrics"]["pattern"])]
        pairs = []
        for keywords, config in self._build(layout["rows"], builder, options, f"tables.{table_id}", fixed):
            columns = {k: (self.resolve(v, keywords) if v[:1] == "@" else v.format(**keywords, cell=config))
                       if isinstance(v, str) else v
                       for k, v in {**layout.get("columns", {}), **keywords.get(ROW_COLUMNS, {})}.items()}
            row = {k: columns[k] if k in columns else keywords[k] for k in names}
            # a column that is not a key rides along (a row's note, or a value the paper's derive hook reads)
            pairs.append(({**row, **{k: v for k, v in columns.items() if k not in layout["keys"]}}, config))
        return pairs

    def metric_cells(self, table_id: str) -> Callable[[str], Optional[Dict[str, Any]]]:
        """Recorded metric name -> the table's metric key columns (``None``: not in this table)."""
        spec = self.table(table_id)["metrics"]
        fields = _pattern_fields(spec["pattern"])
        regex = re.escape(spec["pattern"])
        for field in fields:
            allowed = spec.get(field)
            group = "|".join(re.escape(str(v)) for v in allowed) if allowed is not None else "[^/]+"
            regex = regex.replace(re.escape("{" + field + "}"), f"(?P<{field}>{group})", 1)
        compiled = re.compile(regex)

        def cells(name: str) -> Optional[Dict[str, Any]]:
            found = compiled.fullmatch(name)
            if found is None:
                return None
            out = {}
            for field in fields:
                value, allowed = found.group(field), spec.get(field)
                out[field] = allowed[value] if isinstance(allowed, dict) else value
            return out

        return cells


def _case_columns(case: Mapping[str, Any]) -> Dict[str, Any]:
    """A case's keywords, its own ``columns`` (a table row's) set apart as :data:`ROW_COLUMNS`."""
    out = {k: v for k, v in case.items() if k != "columns"}
    return {**out, ROW_COLUMNS: case["columns"]} if "columns" in case else out


def _is_choice(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("@") and "." not in value


def _is_optional(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"none"}


def _pattern_fields(pattern: str) -> List[str]:
    return re.findall(r"\{(\w+)\}", pattern)


def _keywords(builder: Callable, cell: Iterable[str]) -> set:
    """The keyword names ``builder`` accepts; its ``**settings`` are the spec's ``[cell]`` keys
    (a builder with ``**settings`` hands them to :meth:`Spec.config`)."""
    parameters = inspect.signature(builder).parameters.values()
    named = {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}
    return named | set(cell) if any(p.kind is p.VAR_KEYWORD for p in parameters) else named


# ======================================================================================
# Loading and checking a spec
# ======================================================================================
def load_spec(paper_or_path: str | Path) -> Spec:
    """Read ``fedlib/papers/<paper>/spec.toml`` (or a path) and check it.

    :class:`SpecError` names the file, section and key of what is wrong.
    """
    is_path = str(paper_or_path).endswith(".toml")
    path = Path(paper_or_path) if is_path else PAPERS_DIR / str(paper_or_path) / "spec.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not is_path:
            raise SpecError(f"{paper_or_path}: no such specification (papers with one: "
                            f"{sorted(p.parent.name for p in PAPERS_DIR.glob('*/spec.toml'))})") from None
        raise SpecError(f"{path.name}: no such specification ({path.parent.name}/ holds "
                        f"{sorted(p.name for p in path.parent.glob('*.toml'))})") from None
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path.name}: not valid TOML: {error}") from None
    for table_id, layout in data.get("tables", {}).items():
        if "like" in layout:
            other = data["tables"].get(layout["like"])
            if not isinstance(other, dict) or "like" in other:
                raise _fail(path, f"tables.{table_id}", f"key 'like': {layout['like']!r} is not a table laid out "
                                                        f"in full (tables: {sorted(data['tables'])})")
            data["tables"][table_id] = {**other, **{k: v for k, v in layout.items() if k != "like"}}
    spec = Spec(path, data)
    _check(spec)
    return spec


def _check(spec: Spec) -> None:
    path, data = spec.path, spec.data
    for key in ("paper", "version", "cell"):
        if key not in data:
            raise _fail(path, "top level", f"missing key {key!r}")
    unknown = set(data) - SECTIONS
    if unknown:
        raise _fail(path, "top level", f"unknown section {sorted(unknown)[0]!r}; the sections are {sorted(SECTIONS)}")
    if not isinstance(data["version"], int):
        raise _fail(path, "top level", f"key 'version' must be an integer, got {data['version']!r}")
    for key, later in data.get("versions", {}).items():
        if not isinstance(later, int) or isinstance(later, bool) or later <= data["version"]:
            raise _fail(path, "versions", f"key {key!r}: a cell version must be an integer above version = "
                                          f"{data['version']}, got {later!r}")

    def check_reference(value: Any, where: str, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                check_reference(v, where, f"{key}.{k}")
        elif isinstance(value, list):
            for v in value:
                check_reference(v, where, key)
        elif isinstance(value, str) and value[:1] == "$" and value[1:] not in data.get("options", {}):
            raise _fail(path, where, f"key {key!r}: option {value!r} is not declared in [options] "
                                     f"({sorted(data.get('options', {}))})")
        elif isinstance(value, str) and value[:1] == "@":
            name, _, attribute = value[1:].partition(".")
            if name not in data.get("lists", {}) and name not in data.get("choices", {}):
                raise _fail(path, where, f"key {key!r}: {value!r} names no list in [lists] "
                                         f"({sorted(data.get('lists', {}))}) and no [choices] "
                                         f"({sorted(data.get('choices', {}))})")
            if attribute and name not in data.get("choices", {}):
                raise _fail(path, where, f"key {key!r}: {value!r} takes an attribute of a list; "
                                         "only [choices] have attributes")
            if attribute and any(attribute not in c for c in data["choices"][name].values()):
                missing = [n for n, c in data["choices"][name].items() if attribute not in c]
                raise _fail(path, where, f"key {key!r}: {value!r}: choices {missing} have no {attribute!r}")

    def check_defaults(table: Mapping[str, Any], where: str) -> None:
        for key, value in table.items():
            check_reference(value, where, key)
            if isinstance(value, dict) and "none" in value and (
                    set(value) != {"none"} or value["none"] not in OPTIONAL_TYPES):
                raise _fail(path, where, f"key {key!r}: a None default is written {{ none = \"<type>\" }} with a "
                                         f"type among {sorted(OPTIONAL_TYPES)}, got {value!r}")

    check_defaults(data["cell"], "cell")
    for key, choices in data.get("choices", {}).items():
        for name, attributes in choices.items():
            if "cell" in attributes and not isinstance(attributes["cell"], dict):
                raise _fail(path, f"choices.{key}", f"key '{name}.cell' must be a table of config keys, "
                                                    f"got {attributes['cell']!r}")
            check_defaults(attributes.get("cell", {}), f"choices.{key}.{name}.cell")
    for key, value in data.get("options", {}).items():
        check_reference(value, "options", key)

    def check_blocks(blocks: Any, where: str, rows: bool = False) -> None:
        if not isinstance(blocks, list) or not blocks:
            raise _fail(path, where, "needs at least one block ([[...blocks]] or [[...rows]])")
        for block in blocks:
            if "part" in block and block["part"] not in data.get("parts", {}):
                raise _fail(path, where, f"key 'part': no part {block['part']!r} (parts: {sorted(data['parts'])})")
            for key, value in block.items():
                if key == "sweep":
                    for entry in value:
                        for needed in ("param", "values"):
                            if needed not in entry:
                                raise _fail(path, where, f"key 'sweep': an entry lacks {needed!r}: {entry}")
                        check_reference(entry["values"], where, "sweep.values")
                elif key == "only":
                    for axis, allowed in value.items():
                        value_of = block.get(axis)
                        if not (isinstance(value_of, list) or (isinstance(value_of, str) and value_of[:1] in "@$")):
                            raise _fail(path, where, f"key 'only.{axis}': the block has no axis {axis!r} (only "
                                                     "filters a key whose value is a list, '@list' or '$option')")
                        check_reference(allowed, where, f"only.{axis}")
                elif key == "cases":
                    cases = data.get("lists", {}).get(value[1:], value) if isinstance(value, str) else value
                    if not isinstance(cases, list) or not all(isinstance(case, dict) for case in cases):
                        raise _fail(path, where, "key 'cases': an array of inline tables of keywords (or an "
                                                 f"'@list' of them), got {value!r}")
                    check_reference(value, where, "cases")
                    if not rows and any("columns" in case for case in cases):
                        raise _fail(path, where, "key 'cases': only the cases of a table's row blocks name columns")
                elif key == "columns" and not rows:
                    raise _fail(path, where, "key 'columns': only the row blocks of a table name key columns")
                elif key != "part":
                    check_reference(value, where, key)

    for part, body in data.get("parts", {}).items():
        check_blocks(body.get("blocks"), f"parts.{part}")
    for table_id, layout in data.get("tables", {}).items():
        where = f"tables.{table_id}"
        unknown = set(layout) - TABLE_KEYS
        if unknown:
            raise _fail(path, where, f"unknown key {sorted(unknown)[0]!r}; a table takes {sorted(TABLE_KEYS)}")
        for needed in ("keys", "metrics", "rows"):
            if needed not in layout:
                raise _fail(path, where, f"missing key {needed!r}")
        if "pattern" not in layout["metrics"]:
            raise _fail(path, where, "key 'metrics' needs a 'pattern' such as \"{metric}/{block}\"")
        stray = [f for f in _pattern_fields(layout["metrics"]["pattern"]) if f not in layout["keys"]]
        if stray:
            raise _fail(path, where, f"key 'metrics.pattern': field {stray[0]!r} is not one of keys {layout['keys']}")
        check_blocks(layout["rows"], where, rows=True)
        for key, value in layout.get("repeat_paper", {}).items():
            check_reference(value, where, f"repeat_paper.{key}")
            if isinstance(value, dict):
                by = value.get("by")
                if set(value) - REPEAT_BY_ROWS or not isinstance(by, list) or not isinstance(value.get("mark", ""), str):
                    raise _fail(path, where, f"key 'repeat_paper.{key}': a repeat per our rows is written "
                                             "{ by = [<key columns>], mark = \"<column>\" }, got " + repr(value))
                stray = [k for k in [key, *by] if k not in layout["keys"]]
                if stray:
                    raise _fail(path, where, f"key 'repeat_paper.{key}': {stray[0]!r} is not one of keys "
                                             f"{layout['keys']}")
        if "skeleton" in layout:
            fields = _pattern_fields(layout["metrics"]["pattern"])
            stray = [k for k in layout["skeleton"] if k not in [*fields, "unit"]]
            if stray:
                raise _fail(path, where, f"key 'skeleton.{stray[0]}': not a field of the metric pattern "
                                         f"{fields} (nor 'unit')")
            bare = [f for f in fields if f not in layout["skeleton"] and not isinstance(layout["metrics"].get(f), (list, dict))]
            if bare:
                raise _fail(path, where, f"key 'skeleton': the metric field {bare[0]!r} has no values (give them "
                                         f"in metrics.{bare[0]} or skeleton.{bare[0]})")
            check_reference(layout["skeleton"], where, "skeleton")
        for key, value in layout.get("columns", {}).items():
            check_reference(value, where, f"columns.{key}")


# ======================================================================================
# The table builder
# ======================================================================================
@dataclasses.dataclass
class TableContext:
    """What a table's ``derive`` / ``finish`` function gets: the records and the run -> row index."""

    table_id: str
    records: Sequence[Any]
    index: Mapping[str, Mapping[str, Any]]
    profile: str
    options: Mapping[str, Any]
    cell_kwargs: Mapping[str, Any]

    def runs_of(self, **keys) -> list:
        """Latest records whose row keys include ``keys`` (every seed, in seed order)."""
        from fedlib.reporting.results import latest_records

        def matches(record) -> bool:
            row = self.index.get(record.config_hash)
            return row is not None and all(row.get(k) == v for k, v in keys.items())

        found = [r for r in latest_records(self.records).values() if matches(r)]
        return sorted(found, key=lambda r: r.seed)


def derived_row(keys: Mapping[str, Any], value: float, runs: Sequence[Any], note: str, unit: str,
                provenance: bool = False) -> Dict[str, Any]:
    """A table row computed from other rows' runs: their ids, an empty ``run_metric`` and a ``derived:`` note.

    ``provenance``: also the runs' distinct commits and devices (``;``-joined), so that the row is a
    function of the records (without, the comparison stamps the commit of the checkout writing it).
    """
    row = {**keys, "value": float(value), "n_seeds": len(runs), "run_ids": ";".join(r.config_hash for r in runs),
           "run_metric": "", "ours_unit": unit, "note": f"{DERIVED}: {note}"}
    if provenance:
        row.update({column: ";".join(sorted({str(getattr(r, column)) for r in runs if getattr(r, column)}))
                    for column in ("commit", "device")})
    return row


def metric_units(units: Mapping[str, str], default: str = "count") -> Callable[[pd.DataFrame, Any], pd.DataFrame]:
    """A table hook (``derive``) setting each row's ``ours_unit`` by its ``metric``: ``units[metric]``,
    else ``default``; e.g. ``metric_units({"sparsity": "percent"})`` for a table of dataset statistics."""
    def hook(ours: pd.DataFrame, context: Any) -> pd.DataFrame:
        if len(ours):
            ours["ours_unit"] = [units.get(metric, default) for metric in ours["metric"]]
        return ours
    return hook


def compare(spec: Spec, ours: pd.DataFrame, table_id: str, keys: Sequence[str], profile: str, *,
            repeat_paper: Mapping[str, Sequence[Any]] = {}, unmatched_in_paper_unit: bool = False,
            paper: Optional[pd.DataFrame] = None, **kwargs) -> pd.DataFrame:
    """:func:`~fedlib.reporting.compare_with_paper` of ``ours`` against ``paper_tables/<paper>/<table_id>``.

    An empty ``ours`` is fine; a dataset unknown to ``[choices.dataset]`` is a bug of the
    caller (our rows come from the cell builder), not a gap. Paper cells without a value of
    ours are noted "needs download" outside ``[report] available``, else "not run at this
    profile". Our rows without a paper value are kept (``unmatched="keep"``): smoke cells
    have no paper counterpart, and transcribed tables lack the cells illegible in the paper.

    ``repeat_paper = {key: values}``: the paper table lacks the key column ``key`` (a protocol
    variant of ours, such as the negative sampler); its rows are repeated once per value, in
    order, so that every variant is compared with the same paper value. ``unmatched_in_paper_unit``:
    when every paper row is in percent, our rows without a paper value are converted from
    fractions to percent too (else they would stay in fractions beside percent rows).
    ``paper``: the paper rows to compare with, instead of the ``paper_tables`` file (a skeleton of
    expected rows, :func:`skeleton`, or the file's rows repeated per our rows, :func:`repeat_per_rows`).
    """
    from fedlib.reporting import NEEDS_DOWNLOAD_NOTE, compare_with_paper, load_paper_table

    if ours.empty:
        ours = pd.DataFrame(columns=[*keys, "value"])
    shown = spec.data.get("tables", {}).get(table_id, {}).get("columns", {}).get("dataset", "")
    as_shown = (lambda d: spec.resolve(shown, {"dataset": d})) if str(shown).startswith("@dataset.") else str
    known = [as_shown(d) for d in spec.choices("dataset")]  # as the table shows them ("@dataset.paper")
    if "dataset" in ours.columns and known:
        unknown = set(ours["dataset"]) - set(known)
        if unknown:
            raise ValueError(f"{table_id}: datasets {sorted(unknown)} are not {spec.paper} datasets {list(known)}")
    available = {as_shown(d) for d in spec.resolve(spec.data.get("report", {}).get("available", []), {})}

    def missing_note(row: pd.Series) -> str:
        return "not run at this profile" if str(row.get("dataset", "")) in available else NEEDS_DOWNLOAD_NOTE

    kwargs.setdefault("unmatched", "keep")
    kwargs.setdefault("missing_note", missing_note)  # a paper's own rule replaces this one
    paper = load_paper_table(spec.paper, table_id) if paper is None else paper
    for key, values in repeat_paper.items():
        paper = pd.concat([paper.assign(**{key: value}) for value in values], ignore_index=True)
    out = compare_with_paper(ours, paper, list(keys), profile=profile, **kwargs)
    if unmatched_in_paper_unit and set(paper["unit"].dropna().astype(str)) == {"percent"}:
        unmatched = out["value_paper"].isna() & out["value_ours"].notna() & (out["unit"] == "fraction")
        for column in ("value_ours", "std_ours"):
            out.loc[unmatched, column] = out.loc[unmatched, column].astype(float) * 100.0
        out.loc[unmatched, "unit"] = "percent"
    return out


def unique_row_groups(pairs: Sequence[Tuple[Mapping[str, Any], Mapping[str, Any]]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """``pairs`` with one pair per cell: a later pair of the same config replaces an earlier one in its
    place (as :func:`~fedlib.reporting.results.cell_index` keys the cell's runs by the later pair)."""
    from fedlib.reporting.results import config_hash

    out: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
    for keys, config in pairs:
        out[config_hash(config)] = (keys, dict(config))
    return list(out.values())


def repeat_per_rows(paper: pd.DataFrame, key: str, by: Sequence[str], mark: str,
                    rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """``paper``'s rows, each once per distinct ``rows[i][key]`` among the ``rows`` whose ``by`` columns
    equal the paper row's (in order; none: once, ``key`` empty); copies after the first have ``mark`` true."""
    values: Dict[tuple, List[Any]] = {}
    for row in rows:
        found = values.setdefault(tuple(str(row[k]) for k in by), [])
        if row[key] not in found:
            found.append(row[key])
    out = [{**r, key: value, **({mark: i > 0} if mark else {})}
           for r in paper.to_dict("records")
           for i, value in enumerate(values.get(tuple(str(r[k]) for k in by), [""]))]
    return pd.DataFrame(out, columns=list(dict.fromkeys([*paper.columns, key, *([mark] if mark else [])])))


def skeleton(spec: Spec, table_id: str, rows: Sequence[Mapping[str, Any]], keywords: Sequence[Mapping[str, Any]]
             ) -> pd.DataFrame:
    """The expected rows of a table of ours only (``skeleton`` in its layout): each row group (key
    columns ``rows[i]``, built from ``keywords[i]``) × the metric fields' values, empty paper values."""
    layout = spec.table(table_id)
    fields = _pattern_fields(layout["metrics"]["pattern"])
    given = layout["skeleton"]
    out = []
    for row, chosen in zip(rows, keywords):
        shown = {f: list(dict.fromkeys(v.values() if isinstance(v, dict) else v))
                 for f, v in layout["metrics"].items() if f != "pattern"}  # a mapping's shown values
        axes = [shown[f] if f not in given else spec.resolve(given[f], chosen) for f in fields]
        for values in itertools.product(*axes):
            cell = {**row, **dict(zip(fields, values))}
            out.append({**{k: cell.get(k, "") for k in layout["keys"]}, "table": table_id, "value": float("nan"),
                        "unit": given.get("unit", "percent"), "confidence": ""})
    return pd.DataFrame(out, columns=[*layout["keys"], "table", "value", "unit", "confidence"])


def build_table(spec: Spec, table_id: str, records, profile: str, *, builder: Callable[..., Dict[str, Any]],
                hooks: Mapping[str, Callable] = {},
                options: Mapping[str, Any] = {}, cell_kwargs: Mapping[str, Any] = {},
                missing_note: Optional[Callable[[pd.Series], str]] = None) -> pd.DataFrame:
    """One paper table: recorded runs of the layout's rows x metrics, compared with the paper's numbers.

    ``builder``: the paper's cell builder (the rows' configs), compared by :func:`compare`. ``hooks``: the
    functions the layout's ``derive`` (``(ours, context) -> ours``) and ``finish``
    (``(table, context) -> table``) name. ``missing_note``: the note of a paper row without a value of
    ours (a function of that row), replacing :func:`compare`'s rule.
    """
    from fedlib.reporting import aggregate_runs
    from fedlib.reporting.results import cell_index

    layout = spec.table(table_id)
    pairs = spec.table_rows(table_id, builder, options, **cell_kwargs)
    index = cell_index(records, pairs)
    context = TableContext(table_id, records, index, profile, options, cell_kwargs)
    ours = aggregate_runs(records, lambda r: index.get(r.config_hash), metric_cells=spec.metric_cells(table_id))
    for stage in ("derive", "finish"):
        if stage in layout and layout[stage] not in hooks:
            raise _fail(spec.path, f"tables.{table_id}", f"key {stage!r}: no function {layout[stage]!r} "
                                                        f"among the paper's table hooks {sorted(hooks)}")
    if "derive" in layout:
        ours = hooks[layout["derive"]](ours, context)
    repeat = {key: spec.resolve(values, {}, {**spec._default_options(), **options})
              for key, values in layout.get("repeat_paper", {}).items() if not isinstance(values, dict)}
    paper = None
    if "skeleton" in layout or len(repeat) < len(layout.get("repeat_paper", {})):
        from fedlib.reporting import load_paper_table

        # the keywords each row group was built from (a skeleton resolves "@dataset.domains" with them)
        keywords = [kw for kw, _ in spec._build(layout["rows"], builder, options, f"tables.{table_id}", cell_kwargs)]
        groups = unique_row_groups([((kw, keys), config) for kw, (keys, config) in zip(keywords, pairs)])
        paper = (skeleton(spec, table_id, [k for (_, k), _ in groups], [kw for (kw, _), _ in groups])
                 if "skeleton" in layout else load_paper_table(spec.paper, table_id))
        for key, value in layout.get("repeat_paper", {}).items():
            if isinstance(value, dict):
                paper = repeat_per_rows(paper, key, value["by"], value.get("mark", ""), [k for (_, k), _ in groups])
    table = compare(spec, ours, table_id, list(layout["keys"]), profile, repeat_paper=repeat,
                    unmatched_in_paper_unit=layout.get("unmatched_in_paper_unit", False), paper=paper,
                    **({"missing_note": missing_note} if missing_note is not None else {}))
    return hooks[layout["finish"]](table, context) if "finish" in layout else table
