"""What a lesson shows on screen: source next to its equation, and compact tables.

Every lesson imports these through ``import fedlib.notebook as fnb``:

* :func:`show_source` displays the code of a fedlib function or class with its file and line
  numbers, read from the installed module, so the code a student reads is the code that
  runs (and follows it when the code moves);
* :func:`show` displays one table compactly (at most ``max_rows`` rows, a caption, no
  index), instead of notebook-local ``show()`` helpers that read globals.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from fedlib.paths import project_root

MAX_SOURCE_LINES = 60
"""Longer excerpts are cut (with a note): a lesson shows the lines that implement an equation."""


def _display(mime_bundle: dict) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python: print the plain-text form
        print(mime_bundle["text/plain"])
        return
    if get_ipython() is None:
        print(mime_bundle["text/plain"])
        return
    display(mime_bundle, raw=True)


def source_excerpt(obj: Any, *, start: Optional[str] = None, end: Optional[str] = None,
                   max_lines: int = MAX_SOURCE_LINES) -> tuple[str, Path, int, int]:
    """The source of ``obj`` (function, class or method), optionally narrowed to a part.

    Args:
        obj: a function, method or class defined in a Python file.
        start: keep lines from the first one containing this text (inclusive).
        end: ... up to the first later line containing this text (inclusive).
        max_lines: cut longer excerpts (a lesson shows what implements one equation).

    Returns:
        ``(code, file, first_line, last_line)`` with 1-based line numbers in ``file``.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, a C extension, a lambda typed
            at the prompt).
        ValueError: ``start`` or ``end`` does not occur in the source.
    """
    target = inspect.unwrap(obj)
    try:
        lines, first = inspect.getsourcelines(target)
        file = Path(inspect.getsourcefile(target) or "").resolve()
    except (OSError, TypeError) as error:
        raise TypeError(f"show_source needs a function, method or class defined in a .py file; "
                        f"{obj!r} has no source ({error})") from None
    begin, stop = 0, len(lines)
    if start is not None:
        hits = [i for i, line in enumerate(lines) if start in line]
        if not hits:
            raise ValueError(f"{start!r} does not occur in the source of {getattr(target, '__qualname__', obj)!r}; "
                             "pass a text that appears on the first line you want to show")
        begin = hits[0]
    if end is not None:
        hits = [i for i, line in enumerate(lines) if end in line and i >= begin]
        if not hits:
            raise ValueError(f"{end!r} does not occur after {start!r} in the source of "
                             f"{getattr(target, '__qualname__', obj)!r}")
        stop = hits[0] + 1
    excerpt = lines[begin:stop]
    cut = max(0, len(excerpt) - max_lines)
    if cut:
        excerpt = excerpt[:max_lines]
    code = "".join(excerpt).rstrip("\n")
    if cut:
        code += f"\n# ... {cut} more line(s); narrow the excerpt with start=/end= to see them"
    # Keep the indentation of a method relative to its class body readable.
    return code, file, first + begin, first + begin + len(excerpt) - 1


def relative_path(file: Path) -> str:
    """``file`` relative to the project root when it lies inside it, else its name."""
    try:
        return file.relative_to(project_root()).as_posix()
    except ValueError:
        return file.name


def show_source(obj: Any, *, start: Optional[str] = None, end: Optional[str] = None,
                max_lines: int = MAX_SOURCE_LINES) -> None:
    """Display the code of ``obj`` under a header naming its file and lines.

    ``fnb.show_source(fedavg)`` shows ``fedavg`` as defined in ``fedlib/...``;
    ``start``/``end`` narrow a long function to the lines that implement one equation.
    """
    code, file, first, last = source_excerpt(obj, start=start, end=end, max_lines=max_lines)
    name = getattr(inspect.unwrap(obj), "__qualname__", repr(obj))
    module = getattr(inspect.unwrap(obj), "__module__", "")
    where = f"{relative_path(file)}, lines {first}–{last}"
    header = f"`{module}.{name}` · {where}" if module else f"`{name}` · {where}"
    _display({"text/markdown": f"{header}\n\n```python\n{code}\n```",
              "text/plain": f"{module}.{name} ({where})\n{code}"})


_STYLER_CLASSES = re.compile(r' class="(?:data|row_heading|col_heading|blank|index_name)(?: level\d+)?(?: row\d+)?(?: col\d+)?"(?: (?=>))?')


def lean_html(styler: Any) -> str:
    """A Styler's HTML without what no stylesheet here uses: the ids of cells without a style
    and pandas' per-cell classes (``data row3 col5``). The styled cells keep their ids, so
    shading and colours are unchanged; a lesson's tables take about a third less space in the
    committed notebook."""
    cell_ids, styler.cell_ids = styler.cell_ids, False
    try:
        return _STYLER_CLASSES.sub("", styler.to_html())
    finally:
        styler.cell_ids = cell_ids


def show(table: Any, caption: Optional[str] = None, *, max_rows: int = 30, decimals: int = 2,
         formats: Optional[Mapping[str, str]] = None) -> None:
    """Display a table compactly: no index, at most ``max_rows`` rows, numbers rounded.

    Args:
        table: a pandas DataFrame, Series or Styler.
        caption: one line shown above the table (what it is, where it comes from).
        max_rows: longer tables are cut, and the caption says how many rows were left out
            (long tables belong in ``results/<paper>/*.csv``, not on screen).
        decimals: digits after the point for floating-point columns of a DataFrame.
        formats: column -> format string for columns that ``decimals`` would show badly, e.g.
            ``{"lr": "{:g}"}`` (a learning rate of 5e-4 is not "0.00"); empty cells stay "—".
    """
    import pandas as pd

    formats = dict(formats or {})

    if isinstance(table, pd.Series):
        table = table.to_frame()
    if isinstance(table, pd.DataFrame):
        left_out = max(0, len(table) - max_rows)
        shown = table.head(max_rows)
        note = f" ({left_out} more row(s) not shown)" if left_out else ""
        if not isinstance(shown.index, pd.RangeIndex):
            shown = shown.reset_index()
        unknown = sorted(set(formats) - set(shown.columns))
        if unknown:
            raise KeyError(f"show(formats=...): no column {unknown[0]!r} in the table; its columns are {list(shown.columns)}")
        styler = shown.style.format(precision=decimals, na_rep="—").hide(axis="index")
        if formats:
            styler = styler.format(formats, subset=list(formats), na_rep="—")
        text_caption = (caption or "") + note
        if text_caption:
            styler = styler.set_caption(text_caption)
        formatters = {column: (lambda v, f=f: "—" if pd.isna(v) else f.format(v)) for column, f in formats.items()}
        plain = (f"{text_caption}\n" if text_caption else "") + shown.to_string(index=False, formatters=formatters, na_rep="—")
        _display({"text/html": lean_html(styler), "text/plain": plain})
        return
    if hasattr(table, "to_html") and hasattr(table, "data"):  # a Styler
        if caption:
            table = table.set_caption(caption)
        _display({"text/html": lean_html(table), "text/plain": table.data.to_string()})
        return
    raise TypeError(f"show() takes a DataFrame, Series or Styler, not {type(table).__name__}")
