"""Command line for the data layer: ``data list``, ``data path``, ``data download``, ``data doctor``.

Wiring
    ``fedlib.cli`` calls :func:`add_data_commands` with its sub-parser collection; that adds
    ``fedlib data <command>``. Every command parser sets ``func``: a callable taking the
    parsed ``argparse.Namespace`` and returning the exit code, so the caller dispatches with
    ``return args.func(args)``. For testing, ``python -m fedlib.data.cli list`` runs the same
    commands without the ``data`` prefix.

Extending (e.g. ``data stats``)
    Two ways, both picked up whenever the parser is built:

    * :func:`register_data_subcommand` ``(name, help, configure_fn, run_fn)``, called at
      import time of any module imported before the parser is built;
    * a hook in :data:`PARSER_HOOKS`: ``(module, function)``; when the module exists, the
      function is called with the ``data`` sub-parser collection and adds its own parser
      (``fedlib.data.stats.add_stats_command`` adds ``data stats`` this way).
"""
from __future__ import annotations

import argparse
import os
import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

from fedlib.data.download import (
    data_root,
    dataset_status,
    describe_root,
    download_dataset,
    find_file,
    present_files,
    verify_file,
)
from fedlib.data.doctor import configure_doctor, run_doctor
from fedlib.data.errors import ChecksumError, FedlibDataError
from fedlib.data.registry import DatasetSpec, get_spec, list_specs

PARSER_HOOKS = (("fedlib.data.stats", "add_stats_command"),)
"""``(module, function)`` pairs; ``function(data_subparsers)`` adds a command when the module exists."""

_COUNTS_SIZE_LIMIT = 64 * 1024 * 1024
"""``data list`` counts rows/users/items only when the files to read total less than this."""


@dataclass(frozen=True)
class _Subcommand:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_EXTRA_SUBCOMMANDS: Dict[str, _Subcommand] = {}


def register_data_subcommand(name: str, help: str, configure_fn: Callable[[argparse.ArgumentParser], None],
                             run_fn: Callable[[argparse.Namespace], int]) -> None:
    """Add ``data <name>`` (registering the same name again replaces it).

    Args:
        name: command name, e.g. ``"stats"``.
        help: one-line help shown by ``data --help``.
        configure_fn: adds the command's arguments to its ``argparse`` parser.
        run_fn: runs the command; returns the process exit code.
    """
    if name in ("list", "path", "download", "doctor"):
        raise ValueError(f"'data {name}' is built in and cannot be replaced")
    _EXTRA_SUBCOMMANDS[name] = _Subcommand(name, help, configure_fn, run_fn)


def _run_parser_hooks(commands) -> None:
    for module_name, function_name in PARSER_HOOKS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "the module does not exist (yet)" is ignored; a broken module must fail loudly.
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            continue
        getattr(module, function_name)(commands)


# ----------------------------------------------------------------------------------------
# data list
# ----------------------------------------------------------------------------------------

def _fmt(value: Optional[int]) -> str:
    return "–" if value is None else f"{value:,}"


def _count_nonblank_lines(path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def _cheap_counts(spec: DatasetSpec, root) -> Tuple[Optional[int], Optional[int], Optional[int], str]:
    """(rows, users, items, remark) of the default variant, when its files are present and small.

    Never downloads: counts are only computed from files already on disk.
    """
    from fedlib.data.loaders import c2dsr_item_counts, load_interactions  # heavy import, only when needed

    if spec.kind == "sequences":
        valid = find_file(spec, f"{spec.id}/validdata_new.txt", root)
        test = find_file(spec, f"{spec.id}/testdata_new.txt", root)
        try:
            items_a, items_b = c2dsr_item_counts(spec, root=root)
            items = items_a + items_b
        except FedlibDataError:
            items = None
        if valid is None or test is None:
            return None, None, items, "no sequence files"
        train = find_file(spec, f"{spec.id}/traindata_new.txt", root)
        sequences = sum(_count_nonblank_lines(p) for p in (valid, test, train) if p is not None)
        return sequences, None, items, "rows = valid+test sequences" + (" + train" if train else " (no train)")
    if spec.default_variant is None and None not in spec.variant_names:
        return None, None, None, f"{len(spec.variants)} variants"
    variant = spec.variant(None)
    paths = [find_file(spec, rel, root) for rel in variant.required]
    if spec.id == "ml-1m" and paths[0] is None:
        paths = [find_file(spec, "ml-1m/partial/ratings.dat.gz", root)]
    if any(p is None for p in paths):
        return None, None, None, ""
    if sum(p.stat().st_size for p in paths) > _COUNTS_SIZE_LIMIT:
        return None, None, None, "large; not counted"
    # "data list" only reports what is on disk: a loader that prefers a full file it could
    # download (ml-1m) must not reach for the network from here.
    previous = os.environ.get("FEDLIB_OFFLINE")
    os.environ["FEDLIB_OFFLINE"] = "1"
    try:
        loaded = load_interactions(spec, root=root, allow_partial=True)
    finally:
        if previous is None:
            os.environ.pop("FEDLIB_OFFLINE", None)
        else:
            os.environ["FEDLIB_OFFLINE"] = previous
    remark = f"variant {loaded.variant}" if loaded.variant else ""
    return len(loaded.frame), loaded.num_users, loaded.num_items, remark


def run_list(args: argparse.Namespace) -> int:
    """``data list``: one line per dataset with status computed from the files present."""
    root = data_root(args.root)
    print(f"data root: {describe_root(args.root)}")
    rows = []
    failures = 0
    for spec in list_specs():
        present = present_files(spec, root)
        status = spec.status_for(present)
        counts: Tuple = (None, None, None, "")
        if not args.no_counts and status not in ("missing", "metadata-only"):
            try:
                counts = _cheap_counts(spec, root)
            except FedlibDataError as exc:
                counts = (None, None, None, f"error: {type(exc).__name__}")
        verified = ""
        if args.verify:
            bad = []
            for rel in present:
                path = find_file(spec, rel, root)
                try:
                    verify_file(spec, path, root)
                except ChecksumError:
                    bad.append(rel)
            failures += len(bad)
            verified = (f"ok ({len(present)})" if present else "–") if not bad else "MISMATCH: " + ", ".join(bad)
        rows.append((spec.id, status, f"{len(present)}/{len(spec.files)}", _fmt(counts[0]), _fmt(counts[1]),
                     _fmt(counts[2]), spec.licence_short, counts[3], verified))
    headers = ("id", "status", "files", "rows", "users", "items", "licence", "remark", "sha256" if args.verify else "")
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    for line in [headers] + rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())
    if not args.verify:
        print("\nStatus reflects the files present (not their checksums); add --verify to check sha256.")
    elif failures:
        print(f"\n{failures} file(s) failed verification: delete them and run `data download <id>`.")
    return 1 if failures else 0


# ----------------------------------------------------------------------------------------
# data path
# ----------------------------------------------------------------------------------------

def run_path(args: argparse.Namespace) -> int:
    """``data path [DATASET]``: the data root, or where each file of a dataset is expected."""
    if not args.dataset:
        print(data_root(args.root))
        print(f"# {describe_root(args.root)}; set FEDLIB_DATA to change it", file=sys.stderr)
        return 0
    spec = get_spec(args.dataset)
    root = data_root(args.root)
    print(f"{spec.id}: {root / spec.id}  (status {dataset_status(spec, root)})")
    for f in spec.files:
        found = find_file(spec, f.path, root)
        mark = "present" if found else "MISSING"
        where = found if found else root / f.path
        how = "" if found else ("  [script download]" if (f.urls or (spec.archive and f.in_archive)) else "  [manual]")
        print(f"  {mark:8} {where}{how}")
    if spec.manual_files and any(find_file(spec, f.path, root) is None for f in spec.manual_files):
        print(f"\nmanual download: {spec.manual_instructions(root)}")
    return 0


# ----------------------------------------------------------------------------------------
# data download
# ----------------------------------------------------------------------------------------

def run_download(args: argparse.Namespace) -> int:
    """``data download DATASET|all``: fetch what can be fetched; print manual steps for the rest."""
    ids = [s.id for s in list_specs()] if args.dataset == "all" else [get_spec(args.dataset).id]
    code = 0
    for dataset in ids:
        try:
            report = download_dataset(dataset, args.root, force=args.force,
                                      insecure_tls_if_hash_pinned=args.insecure_tls_if_hash_pinned or None)
        except FedlibDataError as exc:
            print(f"{dataset}: {exc}", file=sys.stderr)
            code = 1
            continue
        print(f"{dataset}: {len(report.written)} file(s) written, {len(report.already_present)} already present")
        for line in report.failed:
            print(f"  FAILED {line}")
        if report.manual:
            print(f"  manual download needed for: {', '.join(report.manual)}")
            print(f"  {report.instructions}")
        if report.failed or report.manual:
            code = 1
    return code


# ----------------------------------------------------------------------------------------
# Parser construction
# ----------------------------------------------------------------------------------------

def _add_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default=None, help="data root (default: $FEDLIB_DATA or ~/.cache/fedlib/data)")


def configure_data_parser(parser: argparse.ArgumentParser) -> None:
    """Add the data commands (built-in and registered) to ``parser``."""
    commands = parser.add_subparsers(dest="data_command", metavar="COMMAND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])

    p = commands.add_parser("list", help="datasets, their status under the data root, counts and licence")
    _add_root(p)
    p.add_argument("--verify", action="store_true", help="also check the sha256 of every present file")
    p.add_argument("--no-counts", action="store_true", help="skip loading files to count rows/users/items")
    p.set_defaults(func=run_list)

    p = commands.add_parser("path", help="print the data root, or where a dataset's files are expected")
    _add_root(p)
    p.add_argument("dataset", nargs="?", help="dataset id (optional)")
    p.set_defaults(func=run_path)

    p = commands.add_parser("download", help="download a dataset (or 'all') into the data root")
    _add_root(p)
    p.add_argument("dataset", help="dataset id or 'all'")
    p.add_argument("--force", action="store_true", help="download again even if files are present")
    p.add_argument("--insecure-tls-if-hash-pinned", action="store_true",
                   help="accept a host whose TLS certificate is broken (expired, self-signed) for files whose "
                        "sha256 is pinned in the registry; the bytes are still checked against that hash")
    p.set_defaults(func=run_download)

    p = commands.add_parser("doctor", help="present / missing files, which lessons need them, which sources answer")
    configure_doctor(p)
    p.set_defaults(func=run_doctor)

    _run_parser_hooks(commands)
    for extra in _EXTRA_SUBCOMMANDS.values():
        p = commands.add_parser(extra.name, help=extra.help)
        extra.configure(p)
        p.set_defaults(func=extra.run)


def add_data_commands(subparsers) -> argparse.ArgumentParser:
    """Register ``data`` and its commands on the top-level CLI's sub-parser collection.

    Returns the ``data`` parser. Dispatch with ``args.func(args)`` (returns the exit code).
    """
    parser = subparsers.add_parser("data", help="datasets: list, path, download, doctor",
                                   description="Datasets of fedlib: status, location, download.")
    configure_data_parser(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Standalone entry point: ``python -m fedlib.data.cli list``."""
    parser = argparse.ArgumentParser(prog="python -m fedlib.data.cli", description="fedlib data commands")
    configure_data_parser(parser)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FedlibDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


__all__ = ["add_data_commands", "configure_data_parser", "register_data_subcommand", "main",
           "run_list", "run_path", "run_download"]

if __name__ == "__main__":
    raise SystemExit(main())
