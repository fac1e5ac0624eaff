"""``python -m fedlib data doctor``: what is present, what is missing, who needs it, who answers.

For each registered dataset the table shows the files present, the files missing and how
they can be obtained (script or manual), which lessons (notebooks) use the dataset, and,
when the network is reachable, which download sources answer right now. Offline (the
``--offline`` flag, ``FEDLIB_OFFLINE=1``, or no source answering the first probe) nothing
is probed, and the table says which lessons will show "needs download" for it.

Which lesson needs which dataset is read from the papers' ``spec.toml`` files
(``[choices.*]`` entries with ``registry = "<id>"`` or ``dataset = "<id>"``) as text, so this module stays in
the data layer; lesson 00 (``notebooks/00_*.py``) is matched by the dataset ids it names.

Probing never hangs: each source gets one ``HEAD`` request with a short timeout
(:data:`PROBE_TIMEOUT_S`), and after the first source that cannot be reached at all
(name resolution or connection failure), the machine is treated as offline.
"""
from __future__ import annotations

import argparse
import socket
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fedlib.data.download import data_root, describe_root, downloads_allowed, find_file
from fedlib.data.registry import DatasetSpec, list_specs
from fedlib.data.sources import describe_failure, host_of
from fedlib.paths import project_root

PROBE_TIMEOUT_S = 3.0
"""Seconds one source may take to answer a ``HEAD`` request in ``data doctor``."""


def lessons_by_dataset(root: Optional[Path] = None) -> Dict[str, List[str]]:
    """``{dataset id: [lesson notebook names]}`` from the papers' spec files and lesson 00.

    Args:
        root: project root (default :func:`fedlib.paths.project_root`).
    """
    root = Path(root) if root is not None else project_root()
    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.py"))
    needed: Dict[str, List[str]] = {}
    for spec_file in sorted((root / "fedlib" / "papers").glob("*/spec.toml")):
        slug = spec_file.parent.name
        lesson = next((nb.stem for nb in notebooks if nb.stem[3:] == slug), slug)
        with open(spec_file, "rb") as fh:
            choices = tomllib.load(fh).get("choices", {})
        for table in choices.values():  # [choices.dataset] (registry = ...) or [choices.task] (dataset = ...)
            for choice in table.values() if isinstance(table, dict) else ():
                if isinstance(choice, dict):
                    for key in ("registry", "dataset"):
                        if isinstance(choice.get(key), str):
                            needed.setdefault(choice[key], []).append(lesson)
    known = {s.id for s in list_specs()}
    for nb in notebooks:
        if nb.stem.startswith("00_"):
            text = nb.read_text(encoding="utf-8")
            for dataset in known:
                if f'"{dataset}"' in text or f"'{dataset}'" in text:
                    needed.setdefault(dataset, []).append(nb.stem)
    return {k: sorted(set(v)) for k, v in needed.items()}


def dataset_sources(spec: DatasetSpec) -> List[Tuple[str, bool]]:
    """``(url, is_mirror)`` of every download source of the dataset, canonical first."""
    out: List[Tuple[str, bool]] = []
    if spec.archive is not None:
        out += [(spec.archive.url, False)] + [(u, True) for u in spec.archive.mirrors]
    for f in spec.files:
        out += [(u, False) for u in f.urls] + [(u, True) for u in f.mirrors]
    seen, unique = set(), []
    for url, mirror in out:
        if url not in seen:
            seen.add(url)
            unique.append((url, mirror))
    return unique


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> Tuple[bool, str]:
    """``(answers, detail)`` for one ``HEAD`` request; never raises, never waits longer than ``timeout``."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "fedlib-data-doctor/1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return True, f"HTTP {response.status}"
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return False, describe_failure(exc)


def _unreachable(detail: str) -> bool:
    """Whether a probe failure means "no network" rather than "this host has a problem"."""
    return any(word in detail for word in ("not resolved", "connection refused", "before the timeout",
                                           "Network is unreachable", "No route"))


def doctor_rows(root: Path, *, online: bool, lessons: Dict[str, List[str]],
                probe_fn=None) -> Tuple[List[Tuple[str, ...]], bool, List[str]]:
    """The table rows, whether probing stayed online, and the per-source probe lines."""
    probe_fn = probe_fn or probe  # looked up at call time, so tests can replace the module's probe
    rows, probe_lines = [], []
    for spec in list_specs():
        present = [f for f in spec.files if find_file(spec, f.path, root) is not None]
        missing = [f for f in spec.files if f.in_full and f not in present]
        script = [f for f in missing if f.source_urls or (spec.archive is not None and f.in_archive)]
        manual = [f for f in missing if f not in script]
        how = ", ".join(filter(None, [f"{len(script)} by script" if script else "",
                                      f"{len(manual)} manual" if manual else ""])) or "–"
        needed_by = ", ".join(lessons.get(spec.id, [])) or "–"
        answers = "not probed (offline)"
        if online and missing:
            results = []
            for url, mirror in dataset_sources(spec):
                ok, detail = probe_fn(url)
                probe_lines.append(f"  {spec.id}: {host_of(url)}{' (mirror)' if mirror else ''}: "
                                   f"{'answers' if ok else 'FAILS'} ({detail})")
                results.append(ok)
                if not ok and _unreachable(detail):
                    online = False
                    break
            answers = f"{sum(results)}/{len(results)} answer" if results else "no source"
        elif not missing:
            answers = "not needed"
        offline_effect = "ok" if not missing else ("needs download" if needed_by != "–" else "–")
        rows.append((spec.id, spec.status_for(f.path for f in present), f"{len(present)}/{len(spec.files)}",
                     f"{len(missing)}" + (f" ({how})" if missing else ""), answers, needed_by, offline_effect))
    return rows, online, probe_lines


def run_doctor(args: argparse.Namespace) -> int:
    """``data doctor``: print the table; exit code 0 (a report, not a check)."""
    root = data_root(args.root)
    online = not args.offline and downloads_allowed()
    why = "--offline" if args.offline else ("FEDLIB_OFFLINE=1" if not downloads_allowed() else "")
    lessons = lessons_by_dataset()
    rows, stayed_online, probe_lines = doctor_rows(root, online=online, lessons=lessons)
    print(f"data root: {describe_root(args.root)}")
    if not online:
        print(f"network: not probed ({why})")
    elif not stayed_online:
        print("network: unreachable (a source could not be reached; the remaining ones were not probed)")
    else:
        print(f"network: probed each missing dataset's sources (HEAD, {PROBE_TIMEOUT_S:g} s timeout)")
    headers = ("dataset", "status", "present", "missing", "sources", "used by lessons", "offline")
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    for line in [headers] + rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())
    if probe_lines:
        print("\nsources:")
        print("\n".join(probe_lines))
    waiting = [(r[0], r[5]) for r in rows if r[6] == "needs download"]
    if waiting:
        print("\nWithout these downloads, the tables of these lessons show 'needs download' for the dataset:")
        for dataset, needed_by in waiting:
            print(f"  {dataset}: {needed_by}  (python -m fedlib data download {dataset}; "
                  f"manual steps: python -m fedlib data path {dataset})")
    return 0


def configure_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default=None, help="data root (default: $FEDLIB_DATA or ~/.cache/fedlib/data)")
    parser.add_argument("--offline", action="store_true",
                        help="do not probe any source (automatic when FEDLIB_OFFLINE=1)")


__all__ = ["PROBE_TIMEOUT_S", "lessons_by_dataset", "dataset_sources", "probe", "doctor_rows", "run_doctor",
           "configure_doctor"]
