"""Record/read glue: values recorded in a notebook come back from the executed .ipynb."""
import json

import nbformat
import numpy as np
import pandas as pd
import pytest

from fedlib.notebook.records import RECORD_MIME, _jsonable, read_record_file, read_records, record, set_current_notebook


def test_jsonable_converts_numbers_arrays_frames_and_nan():
    frame = pd.DataFrame({"a": [1, 2], "b": [0.5, float("nan")]})
    assert _jsonable(np.float32(0.25)) == 0.25
    assert _jsonable(np.arange(3)) == [0, 1, 2]
    assert _jsonable(float("nan")) is None
    assert _jsonable(frame) == {"columns": ["a", "b"], "records": [{"a": 1, "b": 0.5}, {"a": 2, "b": None}]}
    with pytest.raises(TypeError, match="cannot record a value of type object"):
        _jsonable(object())


def test_read_records_from_cell_outputs(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={RECORD_MIME: {"name": "ndcg", "value": 0.31}, "text/plain": "r"}),
        nbformat.v4.new_output("stream", name="stdout", text="noise"),
        nbformat.v4.new_output("display_data", data={RECORD_MIME: json.dumps({"name": "ndcg", "value": 0.4})}),
    ]
    nb.cells = [cell]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert read_records(path) == {"ndcg": 0.4}  # the later record wins


def test_record_file_is_reset_and_appended(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RECORD_DIR", str(tmp_path))
    (tmp_path / "99_demo.jsonl").write_text('{"name": "stale", "value": 1}\n')
    set_current_notebook("99_demo")
    record("loss", np.float64(1.5))
    record("table", pd.DataFrame({"k": [1]}))
    assert read_record_file(tmp_path / "99_demo.jsonl") == {
        "loss": 1.5,
        "table": {"columns": ["k"], "records": [{"k": 1}]},
    }
