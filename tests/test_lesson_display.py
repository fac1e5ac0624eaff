"""The lesson display helpers: source excerpts with their lines, the paper's layout, deviations."""
import inspect
import re

import numpy as np
import pandas as pd
import pytest

from fedlib.notebook.lesson import relative_path, source_excerpt
from fedlib.reporting import deviations, paper_grid


def _toy(values: list[float], block: int = 0) -> float:
    total = 0.0
    for value in values:
        total += value
    return total + block


def test_source_excerpt_names_the_file_and_the_lines_that_run():
    code, file, first, last = source_excerpt(_toy)
    lines, start = inspect.getsourcelines(_toy)
    assert file.name == "test_lesson_display.py" and first == start and last == start + len(lines) - 1
    assert code.splitlines()[0].startswith("def _toy")
    part, _, first_part, last_part = source_excerpt(_toy, start="for value", end="total +=")
    assert part.splitlines() == ["    for value in values:", "        total += value"]
    assert (first_part, last_part) == (start + 2, start + 3)
    assert relative_path(file) == "tests/test_lesson_display.py"


def test_source_excerpt_errors_say_what_to_do():
    with pytest.raises(ValueError, match="does not occur"):
        source_excerpt(_toy, start="no such text")
    with pytest.raises(TypeError, match="no source"):
        source_excerpt(len)
    cut, *_ = source_excerpt(_toy, max_lines=2)
    assert "more line(s)" in cut


def _results():
    return pd.DataFrame({
        "method": ["A", "A", "B", "B"],
        "dataset": ["X", "Y", "X", "Y"],
        "value_ours": [10.0, 5.0, np.nan, 2.0],
        "value_paper": [10.2, 8.0, 4.0, 2.1],
        "flags": ["", "one_seed", "", "at_cap;dirty"],
    }).assign(delta_rel=lambda f: (f.value_ours - f.value_paper) / f.value_paper)


def test_paper_grid_cells_read_ours_then_paper_with_flags():
    table = paper_grid(_results(), rows="method", columns="dataset", styled=False, row_order=["B", "A"])
    assert list(table.index) == ["B", "A"] and list(table.columns) == ["X", "Y"]
    assert table.loc["A", "X"] == "10.00 (10.20)"
    assert table.loc["A", "Y"] == "5.00¹ (8.00)"
    assert table.loc["B", "X"] == "— (4.00)"
    assert table.loc["B", "Y"] == "2.00ᶜᵈ (2.10)"
    assert "one seed" in table.attrs["legend"] and "last allowed round" in table.attrs["legend"]
    html = paper_grid(_results(), rows="method", columns="dataset").to_html()
    assert "#fbdcd8" in html and "#e3f2e6" in html  # A/Y is 37 % off (red), A/X 2 % (green)


def test_paper_grid_refuses_an_empty_table():
    with pytest.raises(ValueError, match="no rows"):
        paper_grid(_results().iloc[:0], rows="method", columns="dataset")


def test_paper_grid_refuses_two_rows_on_one_cell():
    doubled = pd.concat([_results(), _results()])
    with pytest.raises(ValueError, match="several rows fall on one cell"):
        paper_grid(doubled, rows="method", columns="dataset")


def test_every_deviation_needs_a_reason():
    with pytest.raises(ValueError, match="without a reason"):
        deviations(_results(), [], keys=["method", "dataset"])
    found = deviations(_results(), [({"dataset": "Y"}, "one seed")], keys=["method", "dataset"])
    assert found[["method", "dataset"]].values.tolist() == [["A", "Y"]]  # B/X has no value of ours
    assert found["reason"].tolist() == ["one seed"]
    assert found["Δ %"].iloc[0] == pytest.approx(-37.5)


def test_lean_html_keeps_every_cell_and_colour_and_drops_pandas_per_cell_classes():
    from html.parser import HTMLParser

    from fedlib.notebook.lesson import lean_html

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.cells, self.styled_ids, self._open = [], set(), None

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag in ("td", "th"):
                self._open = [attrs.get("colspan", "1")]
                if "id" in attrs:
                    self.styled_ids.add(attrs["id"].split("_", 2)[-1])   # rowR_colC, without the table's uuid

        def handle_data(self, data):
            if self._open is not None:
                self._open.append(data)

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self._open is not None:
                self.cells.append("".join(self._open))
                self._open = None

    styler = paper_grid(_results(), rows="method", columns="dataset", row_order=["B", "A"])
    full, lean = styler.to_html(), lean_html(styler)
    assert 'class="data' not in lean and "col_heading" not in lean and len(lean) < len(full)
    before, after = Cells(), Cells()
    before.feed(full)
    after.feed(lean)
    assert after.cells == before.cells                                  # the same cells, spans and texts
    styled = set(re.findall(r"#T_[0-9a-f]+_(row\d+_col\d+)", full))             # the cells the stylesheet colours
    assert styled and after.styled_ids == styled                         # only cells with a colour keep an id
    assert all(colour in lean for colour in ("#fbdcd8", "#e3f2e6"))
    assert styler.to_html().count('class="data') > 0                    # the caller's Styler is left as it was


def test_show_formats_named_columns_and_says_which_column_is_missing(monkeypatch):
    from fedlib.notebook import lesson

    shown = []
    monkeypatch.setattr(lesson, "_display", shown.append)
    frame = pd.DataFrame({"method": ["A", "B"], "lr": [5e-4, np.nan], "valid MRR": [6.8191, 7.2782]})
    lesson.show(frame, "rates", formats={"lr": "{:g}"})
    [bundle] = shown
    assert "0.0005" in bundle["text/html"] and "0.00<" not in bundle["text/html"]   # not rounded to 0.00
    assert "6.82" in bundle["text/html"] and "—" in bundle["text/html"]
    plain = bundle["text/plain"].splitlines()
    assert plain[0] == "rates" and plain[2].split() == ["A", "0.0005", "6.8191"] and plain[3].split()[1] == "—"
    with pytest.raises(KeyError, match="no column 'rate'"):
        lesson.show(frame, formats={"rate": "{:g}"})
