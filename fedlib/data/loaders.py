"""Raw files -> tidy pandas frames.

Two entry points:

* :func:`load_interactions` -> :class:`LoadedInteractions`, one row per interaction;
* :func:`load_sequences` -> :class:`LoadedSequences`, one row per C2DSR sequence.

Frame contract of :class:`LoadedInteractions` (the protocols rely on it exactly):

=============  ==========  ==============================================================
column         dtype       meaning
=============  ==========  ==============================================================
``user``       int64/str   raw user id as in the file (``str`` only for Amazon 2018 ids)
``item``       int64/str   raw item id as in the file
``rating``     float64     rating, listening count or 1.0 for implicit data
``timestamp``  int64       unix seconds; ``-1`` where the data has no time
``domain``     str         only for multi-domain data (DisenCDR pairs, Douban)
``split``      str         only where the files fix a split: ``"train"`` / ``"test"``
=============  ==========  ==============================================================

Rows are in **file order** (files concatenated in the documented order); nothing is
sorted, because later tie-breaking on equal timestamps relies on file order.

Parsing uses pandas' C parser; a cheap validation afterwards (field count, integer ids,
no missing values) detects malformed lines, and only then is the file rescanned line by
line to report the first bad line with its 1-based number (:class:`MalformedDataError`).
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import pandas as pd

from fedlib.data.download import (
    data_root,
    dataset_status,
    find_file,
    resolve_file,
)
from fedlib.data.errors import (
    FedlibDataError,
    MalformedDataError,
    MissingDataError,
    PartialDataError,
)
from fedlib.data.registry import DatasetSpec, get_spec
from fedlib.data.reading import (  # noqa: F401 (the result types are part of this module's face)
    LoadedInteractions,
    LoadedSequences,
    _UIR,
    _UIRT,
    _frame,
    _no_time,
    _open_text,
    _optional,
    _read_table,
    _require,
    _result,
    _uirt_frame,
)

LASTFM_TIMEZONE = "Europe/Madrid"
"""Time zone of the HetRec Last.fm tag timestamps (local midnight; readme example
``1/4/2009 <-> 1238536800000``)."""


# ----------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------

def load_interactions(
    dataset: "str | DatasetSpec",
    *,
    variant: Optional[str] = None,
    root: "str | os.PathLike | None" = None,
    allow_partial: bool = False,
) -> LoadedInteractions:
    """Load a dataset's interactions as a tidy frame (see the module docstring for columns).

    Args:
        dataset: registry id, e.g. ``"ml-100k"`` (see ``fedlib.data.registry.list_specs()``).
        variant: dataset-specific variant; ``None`` = the documented default.
        root: data root; ``None`` = ``FEDLIB_DATA`` or the user cache folder.
        allow_partial: accept an incomplete copy (ml-1m's partial ratings) for code-path
            tests. Never use that for reported results.

    Raises:
        UnknownDatasetError, UnknownVariantError, MissingDataError, ChecksumError,
        PartialDataError, MalformedDataError.
    """
    spec = get_spec(dataset)
    if spec.kind != "interactions":
        raise FedlibDataError(
            f"{spec.id} holds cross-domain sequences, not an interaction table; "
            f"use fedlib.data.loaders.load_sequences({spec.id!r}).")
    spec.variant(variant)  # validates the name early, with the list of valid ones
    return parser_of(spec)(spec, variant=variant, root=root, allow_partial=allow_partial)


def load_sequences(dataset: "str | DatasetSpec", *, root: "str | os.PathLike | None" = None) -> LoadedSequences:
    """Load C2DSR-format sequence files (``*_new.txt``) and the two item lists.

    Raises:
        MissingDataError: valid/test files (or item lists) absent; the message names every
            missing file and gives the Google Drive instructions.
        MalformedDataError: a line that is not ``user \\t seq \\t item|ts|date| ...``.
    """
    spec = get_spec(dataset)
    if spec.kind != "sequences":
        raise FedlibDataError(
            f"{spec.id} is an interaction table, not C2DSR sequences; use load_interactions({spec.id!r}).")
    return parser_of(spec)(spec, root=root)


def parser_of(spec: DatasetSpec) -> Callable:
    """The loader function of this module that ``spec.parser`` names.

    The registry names its parser rather than holding it: this module imports the registry,
    so the registry importing this module would close an import circle.
    """
    function = globals().get(spec.parser)
    if not callable(function) or not spec.parser.startswith("load_"):
        raise FedlibDataError(
            f"dataset {spec.id!r} names the parser {spec.parser!r}, which fedlib.data.loaders does not define; "
            "define it there (a load_... function) or correct DatasetSpec.parser in fedlib/data/registry.py")
    return function


# ----------------------------------------------------------------------------------------
# MovieLens
# ----------------------------------------------------------------------------------------

def load_movielens_100k(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """ml-100k: ``u.data`` (variant ``None``) or a GroupLens split ``u1``..``u5``, ``ua``, ``ub``.

    Split variants return the ``.base`` rows (``split="train"``) followed by the ``.test``
    rows (``split="test"``). ``ua``/``ub`` hold exactly 10 ratings per user in the test part.
    """
    chosen = spec.variant(variant)
    if chosen.name is None:
        path = _require(spec, chosen.required, root)[chosen.required[0]]
        return _result(spec, None, _uirt_frame(path, "\t"), root, ())
    paths = _require(spec, chosen.required, root)
    base = _read_table(paths[chosen.required[0]], sep="\t", columns=_UIRT)
    test = _read_table(paths[chosen.required[1]], sep="\t", columns=_UIRT)
    both = pd.concat([base, test], ignore_index=True)
    split = np.array(["train"] * len(base) + ["test"] * len(test), dtype=object)
    frame = _frame(both["user"].to_numpy(), both["item"].to_numpy(), both["rating"].to_numpy(),
                   both["timestamp"].to_numpy(), split=split)
    return _result(spec, chosen.name, frame, root, ())


def load_movielens_latest_small(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """ml-latest-small: ``ratings.csv`` (header ``userId,movieId,rating,timestamp``, CRLF)."""
    chosen = spec.variant(variant)
    path = _require(spec, chosen.required, root)[chosen.required[0]]
    return _result(spec, None, _uirt_frame(path, ",", header=True), root, ())


def load_movielens_1m(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """ml-1m: ``ratings.dat`` (``user::item::rating::timestamp``).

    Without the full file, the partial copy ``partial/ratings.dat.gz`` (first 487,650 of
    1,000,209 rows) is loaded only with ``allow_partial=True``, with a loud note.

    Raises:
        PartialDataError: only the partial copy exists and ``allow_partial`` is False.
        MissingDataError: neither copy exists.
    """
    chosen = spec.variant(variant)
    full_rel = chosen.required[0]
    try:
        path = resolve_file(spec, full_rel, root)
    except MissingDataError as missing:
        partial_rel = "ml-1m/partial/ratings.dat.gz"
        if find_file(spec, partial_rel, root) is None:
            raise
        base = data_root(root)
        if not allow_partial:
            raise PartialDataError(
                f"ml-1m: the full ratings file {base / full_rel} is missing; only the PARTIAL copy "
                f"{base / partial_rel} exists. It holds the first 487,650 of the 1,000,209 ratings "
                "(users 1..2,999 of 6,040), so every statistic and result computed on it is wrong for ml-1m. "
                "Pass allow_partial=True only to exercise code paths, never for reported results.\n"
                f"To get the full file: `python -m fedlib data download ml-1m` (downloads {spec.archive.url}), "
                f"or unzip that archive by hand so that {base / full_rel} exists.\n"
                f"Details of the missing file:\n{missing}"
            ) from None
        path = resolve_file(spec, partial_rel, root, download=False)
        frame = _uirt_frame(path, "::")
        note = (f"PARTIAL DATA: ml-1m/partial/ratings.dat.gz holds only the first {len(frame):,} of 1,000,209 "
                f"ratings (users 1..{int(frame['user'].max()):,} of 6,040). It exists to exercise code paths; "
                "NEVER use it for reported results or comparisons with papers.")
        return _result(spec, None, frame, root, (note,), status="partial")
    return _result(spec, None, _uirt_frame(path, "::"), root, ())


def load_hetrec_movielens(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """hetrec2011-movielens-2k: ``user_ratedmovies-timestamps.dat`` (ms timestamps -> seconds)."""
    chosen = spec.variant(variant)
    path = _require(spec, chosen.required, root)[chosen.required[0]]
    raw = _read_table(path, sep="\t", columns=_UIRT, header="auto")
    frame = _frame(raw["user"].to_numpy(), raw["item"].to_numpy(), raw["rating"].to_numpy(),
                   raw["timestamp"].to_numpy() // 1000)
    return _result(spec, None, frame, root, ("Timestamps converted from milliseconds to seconds (floor).",))


# ----------------------------------------------------------------------------------------
# Last.fm
# ----------------------------------------------------------------------------------------

def madrid_midnight_seconds(year, month, day) -> np.ndarray:
    """Unix seconds of local midnight in Europe/Madrid for each (year, month, day).

    This is the convention of the official ``user_taggedartists-timestamps.dat``
    (readme example: 1 April 2009 -> 1238536800000 ms = 2009-03-31T22:00:00Z, CEST).
    Midnight is never skipped or repeated by today's Spanish DST changes (they happen at
    2-3 am).

    Args:
        year, month, day: integer arrays of equal length.

    Returns:
        ``(n,) int64`` seconds; raises ValueError for an impossible calendar date.
    """
    parts = pd.DataFrame({"year": np.asarray(year), "month": np.asarray(month), "day": np.asarray(day)})
    naive = pd.to_datetime(parts, errors="coerce")
    if naive.isna().any():
        bad = int(np.flatnonzero(naive.isna().to_numpy())[0])
        raise ValueError(f"invalid calendar date at position {bad}: "
                         f"{parts.iloc[bad].to_dict()}")
    # Neither case occurs for Spanish midnights since 1940s DST rules; the settings only keep
    # an odd historical date from aborting a load (a skipped midnight moves to the next valid time).
    local = naive.dt.tz_localize(LASTFM_TIMEZONE, ambiguous=True, nonexistent="shift_forward")
    epoch = pd.Timestamp("1970-01-01", tz="UTC")
    return ((local - epoch) // pd.Timedelta(seconds=1)).to_numpy(dtype="int64")


def _lastfm_assignments(spec: DatasetSpec, root) -> Tuple[pd.DataFrame, str, List[str]]:
    """Every tag assignment in file order: columns user, item, tag, timestamp (unix seconds).

    Returns:
        (frame, description of the time source, notes)
    """
    stamped = _optional(spec, "hetrec2011-lastfm-2k/user_taggedartists-timestamps.dat", root)
    notes: List[str] = []
    if stamped is not None:
        raw = _read_table(stamped, sep="\t", header="auto",
                          columns=(("user", "int"), ("item", "int"), ("tag", "int"), ("timestamp", "int")))
        seconds = raw["timestamp"].to_numpy() // 1000
        source = "user_taggedartists-timestamps.dat (ms -> s)"
    else:
        rel = "hetrec2011-lastfm-2k/user_taggedartists.dat"
        path = _require(spec, [rel], root)[rel]
        raw = _read_table(path, sep="\t", header="auto",
                          columns=(("user", "int"), ("item", "int"), ("tag", "int"),
                                   ("day", "int"), ("month", "int"), ("year", "int")))
        # Convert each distinct day once (a few thousand) and map back to the 186k rows.
        day_key = raw["year"].to_numpy() * 10000 + raw["month"].to_numpy() * 100 + raw["day"].to_numpy()
        unique_days, row_day = np.unique(day_key, return_inverse=True)
        try:
            day_seconds = madrid_midnight_seconds(unique_days // 10000, (unique_days // 100) % 100, unique_days % 100)
        except ValueError as exc:
            raise _first_bad_date(path, exc) from None
        seconds = day_seconds[row_day]
        source = "user_taggedartists.dat day/month/year (Madrid midnight)"
        notes.append(
            "DERIVED TIMESTAMPS: user_taggedartists-timestamps.dat is missing, so times were derived from the "
            "day/month/year columns of user_taggedartists.dat: local midnight Europe/Madrid of the tag day, as unix "
            "seconds. This is the convention of the official file (readme: 1/4/2009 <-> 1238536800000 ms), so the "
            "values should equal the official ones divided by 1000; resolution is one day, so many interactions tie "
            "and ties keep file order.")
    frame = pd.DataFrame({"user": raw["user"].to_numpy(), "item": raw["item"].to_numpy(),
                          "tag": raw["tag"].to_numpy(), "timestamp": np.asarray(seconds, dtype="int64")})
    start_2002 = int(madrid_midnight_seconds([2002], [1], [1])[0])
    early = int((frame["timestamp"] < start_2002).sum())
    if early:
        before_epoch = int((frame["timestamp"] < 0).sum())
        earliest = pd.Timestamp(int(frame["timestamp"].min()), unit="s").year
        epoch_text = (f" {before_epoch:,} of them fall before 1970, i.e. NEGATIVE unix seconds: test for missing time "
                      "with timestamp == -1, not timestamp < 0." if before_epoch else "")
        notes.append(f"{early:,} tag assignments are dated before 2002 (earliest {earliest}), implausibly early for "
                     f"Last.fm; such dates are in the original data and were kept.{epoch_text}")
    return frame, source, notes


def _lastfm_tag_times(spec: DatasetSpec, root) -> Tuple[pd.DataFrame, str, List[str]]:
    """Per (user, artist) tagged pair, in order of first appearance: first tag time.

    Returns:
        (frame with columns user, item, timestamp; time source; notes)
    """
    assignments, source, notes = _lastfm_assignments(spec, root)
    first = assignments.drop_duplicates(["user", "item"], keep="first")[["user", "item"]]
    times = assignments.groupby(["user", "item"], sort=False)["timestamp"].min()
    pairs = first.join(times, on=["user", "item"])
    return pairs.reset_index(drop=True), source, notes


def _first_bad_date(path: Path, exc: Exception) -> MalformedDataError:
    with _open_text(path) as fh:
        for number, raw_line in enumerate(fh, start=1):
            fields = raw_line.rstrip("\r\n").split("\t")
            if number == 1 or len(fields) != 6:
                continue
            try:
                pd.Timestamp(year=int(fields[5]), month=int(fields[4]), day=int(fields[3]))
            except ValueError:
                return MalformedDataError(path, number, raw_line.rstrip("\r\n"), "day/month/year is not a valid date")
    return MalformedDataError(path, 0, "", f"invalid date ({exc})")


def load_lastfm(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """hetrec2011-lastfm-2k, three variants.

    ``"listens"`` (default): ``user_artists.dat`` rows in file order; ``rating`` = listening
    count (``weight``); ``timestamp`` = first tag time of the (user, artist) pair, ``-1``
    when the user never tagged that artist (about 78 % of the rows).

    ``"tagged"``: one row per (user, artist) pair of ``user_taggedartists``, in order of
    first appearance; ``rating`` = 1.0 (implicit: the user tagged the artist);
    ``timestamp`` = first tag time of the pair. Every row has a time: this is the variant a
    time-ordered protocol (F3CRec's Lastfm-2K) needs.

    ``"tag_assignments"``: every row of ``user_taggedartists`` in file order, rating 1.0, with
    an extra int64 column ``tag`` after ``timestamp`` (the only frame with a column beyond
    the contract's ``domain``/``split``).

    Tag times come from ``user_taggedartists-timestamps.dat`` when present (ms -> s),
    otherwise they are derived from the day/month/year columns (Madrid midnight, see
    :func:`madrid_midnight_seconds`); ``notes`` says which.
    """
    chosen = spec.variant(variant)
    if chosen.name == "tag_assignments":
        assignments, source, notes = _lastfm_assignments(spec, root)
        frame = _frame(assignments["user"].to_numpy(), assignments["item"].to_numpy(), np.ones(len(assignments)),
                       assignments["timestamp"].to_numpy(), tag=assignments["tag"].to_numpy(dtype="int64"))
        notes = [f"variant 'tag_assignments': one row per tag assignment ({len(frame):,} rows, file order) with an "
                 f"extra int64 column 'tag' (tagID); rating 1.0; the same (user, artist) pair repeats once per tag; "
                 f"timestamp from {source}."] + notes
        return _result(spec, "tag_assignments", frame, root, notes)
    tag_pairs, source, notes = _lastfm_tag_times(spec, root)
    if chosen.name == "tagged":
        frame = _frame(tag_pairs["user"].to_numpy(), tag_pairs["item"].to_numpy(), np.ones(len(tag_pairs)),
                       tag_pairs["timestamp"].to_numpy())
        notes = [f"variant 'tagged': one row per (user, artist) pair the user tagged ({len(frame):,} pairs), in "
                 f"order of first appearance; rating 1.0 (implicit); timestamp = first tag time from {source}. "
                 "Not the listening data: tagging is a different (and sparser per user) signal."] + notes
        listens_path = _optional(spec, "hetrec2011-lastfm-2k/user_artists.dat", root)
        if listens_path is not None:
            listened = _read_table(listens_path, sep="\t", header="auto", columns=_UIR)
            overlap = tag_pairs.merge(listened[["user", "item"]], on=["user", "item"], how="left", indicator=True)
            unlistened = int((overlap["_merge"] == "left_only").sum())
            notes.append(f"{unlistened:,} of the {len(frame):,} tagged pairs have no listening record in user_artists.dat.")
        return _result(spec, "tagged", frame, root, notes)

    path = _require(spec, chosen.required, root)[chosen.required[0]]
    listens = _read_table(path, sep="\t", header="auto", columns=_UIR)
    # A left merge keeps the left frame's row order (file order).
    timed = listens.merge(tag_pairs[["user", "item", "timestamp"]], on=["user", "item"], how="left")
    untimed = int(timed["timestamp"].isna().sum())
    timestamps = timed["timestamp"].fillna(-1).to_numpy(dtype="int64")
    frame = _frame(listens["user"].to_numpy(), listens["item"].to_numpy(), listens["rating"].to_numpy(), timestamps)
    notes = [f"variant 'listens': rating = listening count (user_artists.dat 'weight'), not a rating scale; "
             f"timestamp = first tag time of the (user, artist) pair from {source}."] + notes
    if untimed:
        notes.append(f"NO TIME for {untimed:,} of {len(frame):,} rows (pairs the user never tagged): timestamp -1. "
                     "A time-ordered protocol must drop them or use variant='tagged'.")
    return _result(spec, "listens", frame, root, notes)


# ----------------------------------------------------------------------------------------
# FilmTrust, Amazon
# ----------------------------------------------------------------------------------------

def load_filmtrust(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """filmtrust: ``raw`` (LibRec ``ratings.txt``, space-separated, no time) or ``fedrkg``."""
    chosen = spec.variant(variant)
    path = _require(spec, chosen.required, root)[chosen.required[0]]
    if chosen.name == "raw":
        raw = _read_table(path, sep=" ", columns=_UIR)
        frame = _frame(raw["user"].to_numpy(), raw["item"].to_numpy(), raw["rating"].to_numpy(), _no_time(len(raw)))
        return _result(spec, "raw", frame, root, ("FilmTrust has no timestamps: timestamp is -1 for every row.",))
    frame = _uirt_frame(path, ",")
    notes = (
        "FABRICATED TIMESTAMPS: FedRKG's 'timestamp' column is not a time; it is the rank of the item's first "
        "appearance in the raw ratings file, made up by FedRKG's preprocessing. Do not read it as time.",
        "Processed by FedRKG: users with >= 10 ratings kept, user and item ids re-indexed from 0.",
    )
    return _result(spec, "fedrkg", frame, root, notes)


def load_amazon_video(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """amazon-video: FedRKG's ``ratings.dat`` (``user,item,rating,timestamp``, no header)."""
    chosen = spec.variant(variant)
    path = _require(spec, chosen.required, root)[chosen.required[0]]
    return _result(spec, None, _uirt_frame(path, ","), root, spec.notes)


def parse_amazon_reviews(path: "str | os.PathLike") -> pd.DataFrame:
    """Parse an Amazon 2018 review file (json lines, optionally gzipped) into the contract frame.

    Fields used: ``reviewerID`` -> user (str), ``asin`` -> item (str), ``overall`` -> rating,
    ``unixReviewTime`` -> timestamp. Other fields (review text, images, ...) are ignored.

    Raises:
        MalformedDataError: a line that is not JSON or lacks one of the four fields.
    """
    path = Path(path)
    users: List[str] = []
    items: List[str] = []
    ratings: List[float] = []
    times: List[int] = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                users.append(str(record["reviewerID"]))
                items.append(str(record["asin"]))
                ratings.append(float(record["overall"]))
                times.append(int(record["unixReviewTime"]))
            except json.JSONDecodeError as exc:
                raise MalformedDataError(path, number, line.rstrip("\n"), f"not valid JSON ({exc.msg})") from None
            except KeyError as exc:
                raise MalformedDataError(path, number, line.rstrip("\n"), f"missing field {exc.args[0]!r}") from None
            except (TypeError, ValueError) as exc:
                raise MalformedDataError(path, number, line.rstrip("\n"), f"bad value ({exc})") from None
    return _frame(np.array(users, dtype=object), np.array(items, dtype=object), ratings, times)


def load_amazon_industrial(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """amazon-industrial: ``Industrial_and_Scientific_5.json.gz`` (Amazon 2018 5-core)."""
    chosen = spec.variant(variant)
    path = _require(spec, chosen.required, root)[chosen.required[0]]
    frame = parse_amazon_reviews(path)
    return _result(spec, None, frame, root,
                   ("user and item are Amazon's string ids (reviewerID, asin), not integers.",))


# ----------------------------------------------------------------------------------------
# Cross-domain substitutes
# ----------------------------------------------------------------------------------------

def load_amazon_cdr(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """amazon-cdr-disencdr: one DisenCDR domain pair, e.g. ``variant="phone_sport"``.

    DisenCDR stores a pair ``a_b`` in two folders: ``a_b/`` holds domain ``a``'s
    interactions of the users shared by ``a`` and ``b``, and ``b_a/`` holds domain ``b``'s
    interactions of the *same* users under the *same* user ids (its loader reads ``a_b`` as
    source and ``b_a`` as target and asserts equal user counts). Item ids are per domain
    (both start at 0). So ``phone_sport`` and ``sport_phone`` contain the same four files;
    the variant only fixes the order (first-named domain first).

    Rows: ``a`` train, ``a`` test, ``b`` train, ``b`` test (each file in file order), with
    ``domain`` = ``a``/``b`` and ``split`` = ``train``/``test``. All ratings are 1.0
    (implicit), no timestamps (-1). ``test.txt`` holds at most one held-out item per user:
    it is ``test_original.txt`` minus the rows whose item never occurs in that domain's
    training file.
    """
    chosen = spec.variant(variant)  # variant=None raises UnknownVariantError listing the pairs
    paths = _require(spec, chosen.required, root)
    first, second = chosen.name.split("_")
    parts = []
    for domain, folder in ((first, chosen.name), (second, f"{second}_{first}")):
        for split in ("train", "test"):
            raw = _read_table(paths[f"amazon-cdr-disencdr/{folder}/{split}.txt"], sep="\t", columns=_UIR)
            raw["domain"] = domain
            raw["split"] = split
            parts.append(raw)
    both = pd.concat(parts, ignore_index=True)
    frame = _frame(both["user"].to_numpy(), both["item"].to_numpy(), both["rating"].to_numpy(), _no_time(len(both)),
                   domain=both["domain"].to_numpy(dtype=object), split=both["split"].to_numpy(dtype=object))
    notes = spec.notes + (
        f"Pair semantics: folder {chosen.name}/ = domain '{first}', folder {second}_{first}/ = domain '{second}'; "
        "the same users with the same user ids in both; item ids are separate per domain (both start at 0).",
        "Implicit data (every rating is 1.0), no timestamps (-1). test.txt = test_original.txt without held-out "
        "items that never occur in the domain's train file (DisenCDR evaluates on test.txt).",
    )
    return _result(spec, chosen.name, frame, root, notes)


def load_douban(spec: DatasetSpec, *, variant=None, root=None, allow_partial=False) -> LoadedInteractions:
    """douban-gadtcdr: ``variant`` ``"book"``, ``"music"``, ``"movie"`` or ``None`` (all present).

    ``None`` concatenates book then music (then movie if present) with a ``domain`` column.
    User ids share one space across domains; item ids are per domain. No timestamps (-1).

    Raises:
        MissingDataError: ``variant="movie"`` without ``douban_movie/ratings.dat`` (manual download).
    """
    chosen = spec.variant(variant)
    notes = list(spec.notes) + ["No timestamps in GA-DTCDR's files: timestamp is -1 for every row."]
    if chosen.name is not None:
        domains = [chosen.name]
    else:
        domains = ["book", "music"]
        if find_file(spec, "douban-gadtcdr/douban_movie/ratings.dat", root) is not None:
            domains.append("movie")
        else:
            notes.append("The movie domain is missing (douban_movie/ratings.dat is not in the reference collection); "
                         "only book and music are loaded. See the registry's manual instructions to add it.")
    paths = _require(spec, [f"douban-gadtcdr/douban_{d}/ratings.dat" for d in domains], root)
    parts = []
    for domain in domains:
        raw = _read_table(paths[f"douban-gadtcdr/douban_{domain}/ratings.dat"], sep="\t", columns=_UIR)
        raw["domain"] = domain
        parts.append(raw)
    both = pd.concat(parts, ignore_index=True)
    extra = {} if chosen.name is not None else {"domain": both["domain"].to_numpy(dtype=object)}
    frame = _frame(both["user"].to_numpy(), both["item"].to_numpy(), both["rating"].to_numpy(), _no_time(len(both)), **extra)
    if chosen.name is None:
        notes.append("User ids share one space across domains (the same id is the same Douban user); "
                     "item ids are separate per domain.")
    return _result(spec, chosen.name, frame, root, notes)


# ----------------------------------------------------------------------------------------
# C2DSR sequences
# ----------------------------------------------------------------------------------------

_C2DSR_DOMAINS = {
    "c2dsr-food-kitchen": ("Food", "Kitchen"),
    "c2dsr-movie-book": ("Movie", "Book"),
    "c2dsr-entertainment-education": ("Entertainment", "Education"),
}


def _count_lines(path: Path) -> int:
    with _open_text(path) as fh:
        return sum(1 for line in fh if line.strip())


def c2dsr_item_counts(dataset: "str | DatasetSpec", *, root: "str | os.PathLike | None" = None) -> Tuple[int, int]:
    """``(num_items_a, num_items_b)`` from ``Alist.txt``/``Blist.txt`` (or ``items_x``/``items_y``).

    Works even when the sequence files are missing (Entertainment-Education).
    """
    spec = get_spec(dataset)
    counts = []
    for preferred, fallback in (("Alist.txt", "items_x.txt"), ("Blist.txt", "items_y.txt")):
        rel = f"{spec.id}/{preferred}"
        if find_file(spec, rel, root) is None and spec.file(f"{spec.id}/{fallback}") is not None \
                and find_file(spec, f"{spec.id}/{fallback}", root) is not None:
            rel = f"{spec.id}/{fallback}"
        counts.append(_count_lines(_require(spec, [rel], root)[rel]))
    return counts[0], counts[1]


def parse_c2dsr_file(path: "str | os.PathLike") -> pd.DataFrame:
    """Parse one C2DSR ``*_new.txt`` file.

    Line format: ``user \\t seq_id \\t item|epoch_seconds|YYYY-mm-dd HH:MM:SS| \\t ...``.
    Entries are sorted by time with a stable sort (ties keep file order), as the C2DSR
    loader does.

    Returns:
        Frame with columns ``user`` (int64), ``seq_id`` (int64), ``items`` (list[int]),
        ``timestamps`` (list[int]); one row per non-empty line, in file order.
    """
    path = Path(path)
    users: List[int] = []
    seq_ids: List[int] = []
    item_lists: List[List[int]] = []
    time_lists: List[List[int]] = []
    with _open_text(path) as fh:
        for number, raw_line in enumerate(fh, start=1):
            line = raw_line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            try:
                if len(fields) < 3:
                    raise ValueError("expected 'user<TAB>seq_id<TAB>item|time|date|...'")
                user, seq_id = int(fields[0]), int(fields[1])
                entries = []
                for entry in fields[2:]:
                    if not entry:
                        continue
                    item_text, time_text = entry.split("|", 2)[:2]
                    entries.append((int(time_text), int(item_text)))
                if not entries:
                    raise ValueError("no item entries")
            except ValueError as exc:
                raise MalformedDataError(path, number, line, str(exc) or "bad item entry") from None
            entries.sort(key=lambda pair: pair[0])  # stable: equal times keep file order
            users.append(user)
            seq_ids.append(seq_id)
            time_lists.append([t for t, _ in entries])
            item_lists.append([i for _, i in entries])
    return pd.DataFrame({
        "user": np.asarray(users, dtype="int64"),
        "seq_id": np.asarray(seq_ids, dtype="int64"),
        "items": pd.Series(item_lists, dtype=object),
        "timestamps": pd.Series(time_lists, dtype=object),
    })


def load_c2dsr_sequences(spec: DatasetSpec, *, root=None) -> LoadedSequences:
    """C2DSR datasets: item counts plus valid/test (and train when present) sequences."""
    sequence_files = [f"{spec.id}/validdata_new.txt", f"{spec.id}/testdata_new.txt"]
    needed = list(sequence_files)
    has_lists = all(find_file(spec, f"{spec.id}/{n}", root) for n in ("Alist.txt", "Blist.txt")) or \
        all(find_file(spec, f"{spec.id}/{n}", root) for n in ("items_x.txt", "items_y.txt"))
    if not has_lists:
        needed = [f"{spec.id}/Alist.txt", f"{spec.id}/Blist.txt"] + needed
    paths = _require(spec, needed, root)  # one error naming every missing file
    num_a, num_b = c2dsr_item_counts(spec, root=root)
    valid = parse_c2dsr_file(paths[sequence_files[0]])
    test = parse_c2dsr_file(paths[sequence_files[1]])
    train_path = _optional(spec, f"{spec.id}/traindata_new.txt", root)
    train = parse_c2dsr_file(train_path) if train_path is not None else None
    names = _C2DSR_DOMAINS.get(spec.id, ("A", "B"))
    notes = [f"Item ids < {num_a:,} are domain A ({names[0]}); ids {num_a:,}..{num_a + num_b - 1:,} are domain B "
             f"({names[1]}).",
             "Entries are sorted by timestamp with a stable sort (ties keep file order), as the C2DSR loader does; "
             "the last item of each valid/test sequence is its held-out target."]
    if train is None:
        notes.insert(0, f"NO TRAINING DATA: {spec.id}/traindata_new.txt is missing (4 MiB or more, not in the "
                        "reference collection), so train is None. Only valid/test sequences are available; "
                        f"see the manual instructions of '{spec.id}' in the registry to add it.")
    return LoadedSequences(dataset=spec.id, num_items_a=num_a, num_items_b=num_b, train=train, valid=valid, test=test,
                           status=dataset_status(spec, root), notes=tuple(notes), domain_names=names)


__all__ = [
    "LoadedInteractions",
    "LoadedSequences",
    "load_interactions",
    "load_sequences",
    "parser_of",
    "c2dsr_item_counts",
    "parse_c2dsr_file",
    "parse_amazon_reviews",
    "madrid_midnight_seconds",
    "LASTFM_TIMEZONE",
]
