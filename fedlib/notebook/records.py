"""Recorded metrics: a notebook records named values; tests read them back.

``record(name, value)`` stores the value (silently) in the cell's
output under the MIME type :data:`RECORD_MIME`, so :func:`read_records` can recover every
recorded value from an executed ``.ipynb`` (no scrapbook dependency). When
``FEDLIB_RECORD_DIR`` is set, each record is also appended to
``$FEDLIB_RECORD_DIR/<notebook>.jsonl``; the test suite uses that to share one smoke
execution between nbval and the recorded-metric assertions.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

RECORD_MIME = "application/vnd.fedlib.record+json"
FINISHED_KEY = "__finished__"

_current_notebook: dict[str, str] = {}


def _jsonable(value: Any) -> Any:
    """Convert numbers, arrays, tensors and frames to plain JSON values (NaN -> None)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = None
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        value = value.detach().cpu().numpy()
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # pandas DataFrame
        return {"columns": [str(c) for c in value.columns], "records": _jsonable(value.to_dict(orient="records"))}
    if hasattr(value, "to_dict") and hasattr(value, "index"):  # pandas Series
        return _jsonable({str(k): v for k, v in value.to_dict().items()})
    if np is not None and isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if np is not None and isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    raise TypeError(f"cannot record a value of type {type(value).__name__}; record numbers, strings, lists, dicts, arrays or DataFrames")


def set_current_notebook(name: str, *, reset_file: bool = True) -> None:
    """Remember which notebook is recording; truncate its record file (a fresh run)."""
    _current_notebook["name"] = name
    path = record_file(name)
    if path is not None and reset_file:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def record_file(notebook: str) -> Path | None:
    directory = os.environ.get("FEDLIB_RECORD_DIR")
    return Path(directory) / f"{notebook}.jsonl" if directory else None


def _append_to_file(name: str, payload: Any) -> None:
    notebook = _current_notebook.get("name")
    path = record_file(notebook) if notebook else None
    if path is None:
        return
    with path.open("a") as handle:
        handle.write(json.dumps({"name": name, "value": payload}) + "\n")


def record(name: str, value: Any, *, show: bool = False) -> None:
    """Record ``value`` under ``name`` in the executed notebook.

    Recording prints nothing (the notebook shows its numbers itself); ``show=True`` adds a
    one-line ``recorded name = value`` for debugging.
    """
    if not name or not isinstance(name, str):
        raise ValueError("a record needs a non-empty string name")
    payload = _jsonable(value)
    _append_to_file(name, payload)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python: the file (if any) is the only sink
        return None
    if get_ipython() is None:
        return None
    if not show:
        text = ""
    elif isinstance(payload, (int, float, str, bool)) or payload is None:
        text = f"recorded {name} = {payload!r}"
    else:
        text = f"recorded {name}"  # tables are shown by the notebook itself, once
    display({RECORD_MIME: {"name": name, "value": payload}, "text/plain": text}, raw=True)
    return None


def read_records(ipynb_path: str | Path) -> dict[str, Any]:
    """All records of an executed notebook, ``{name: value}`` (later records win)."""
    import nbformat

    notebook = nbformat.read(str(ipynb_path), as_version=4)
    records: dict[str, Any] = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if RECORD_MIME in data:
                item = data[RECORD_MIME]
                if isinstance(item, str):
                    item = json.loads(item)
                records[item["name"]] = item["value"]
    return records


def read_record_file(path: str | Path) -> dict[str, Any]:
    """Records appended to a ``FEDLIB_RECORD_DIR`` file, ``{name: value}``."""
    records: dict[str, Any] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            records[item["name"]] = item["value"]
    return records


def record_frame(record: Mapping[str, Any]):
    """A table record (``{"columns": [...], "records": [...]}``, as :func:`record` stores a DataFrame) as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(record["records"], columns=record["columns"])
