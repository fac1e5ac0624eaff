"""Exceptions of the data layer.

Every message answers two questions: *what is wrong* and *what to do about it*. A reader
who hits one of these in a notebook should be able to fix the problem without opening
the source.

Hierarchy::

    FedlibDataError (RuntimeError)
    ├── UnknownDatasetError   (+ LookupError)       unknown dataset id
    ├── UnknownVariantError   (+ ValueError)        unknown variant of a known dataset
    ├── MissingDataError      (+ FileNotFoundError) a needed file is absent and cannot be fetched
    ├── ChecksumError                               a file's sha256 differs from the registry
    ├── PartialDataError                            only an incomplete copy exists
    ├── UnsafeArchiveError                          an archive member escapes its folder
    ├── MalformedDataError    (+ ValueError)        a line cannot be parsed
    ├── UnknownProtocolError  (+ LookupError)       raised by ``fedlib.data.protocols``
    └── EmptyUserError        (+ ValueError)        raised by ``fedlib.data.protocols``

The secondary bases let generic ``except FileNotFoundError`` / ``except ValueError``
handlers keep working.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Optional, Sequence


class FedlibDataError(RuntimeError):
    """Base class of every error raised by ``fedlib.data``."""


class UnknownDatasetError(FedlibDataError, LookupError):
    """A dataset id that the registry does not know.

    Attributes:
        dataset: the id that was asked for.
        known: every registered id.
        suggestion: the closest registered id, or ``None``.
    """

    def __init__(self, dataset: str, known: Sequence[str]):
        self.dataset = dataset
        self.known = tuple(known)
        self.suggestion = closest_match(dataset, self.known)
        hint = f" Did you mean {self.suggestion!r}?" if self.suggestion else ""
        super().__init__(
            f"Unknown dataset id {dataset!r}.{hint} Known ids: {', '.join(self.known)}. "
            "Use one of them exactly (ids are lower-case, words joined by '-'); "
            "`python -m fedlib data list` shows them with their status."
        )


class UnknownVariantError(FedlibDataError, ValueError):
    """A variant name that the dataset does not offer."""

    def __init__(self, dataset: str, variant: Optional[str], known: Sequence[Optional[str]]):
        self.dataset = dataset
        self.variant = variant
        self.known = tuple(known)
        names = [repr(v) for v in self.known]
        if variant is None:
            problem = f"Dataset {dataset!r} has no default variant: choose one explicitly."
        else:
            suggestion = closest_match(str(variant), [v for v in self.known if v is not None])
            hint = f" Did you mean {suggestion!r}?" if suggestion else ""
            problem = f"Dataset {dataset!r} has no variant {variant!r}.{hint}"
        super().__init__(f"{problem} Available variants: {', '.join(names)}. Pass one of them as `variant=`.")


class MissingDataError(FedlibDataError, FileNotFoundError):
    """A file needed to load a dataset is absent and could not be obtained automatically.

    Attributes:
        dataset: registry id.
        missing: relative paths (under the data root) of the missing files.
        root: the data root that was searched.
    """

    def __init__(self, message: str, *, dataset: str = "", missing: Iterable[str] = (), root: Optional[Path] = None):
        self.dataset = dataset
        self.missing = tuple(missing)
        self.root = root
        super().__init__(message)

    def __str__(self) -> str:  # FileNotFoundError would otherwise format errno/filename
        return str(self.args[0]) if self.args else ""


class ChecksumError(FedlibDataError):
    """A file (or a downloaded archive) whose sha256 differs from the expected one.

    Attributes:
        path: the offending file (or the URL of a discarded download).
        expected, actual: hex sha256 digests.
    """

    def __init__(self, path: "Path | str", expected: str, actual: str, advice: str = ""):
        self.path = path
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"Checksum mismatch for {self.path}:\n"
            f"  expected sha256 {expected}\n"
            f"  actual   sha256 {actual}\n"
            + (advice or
               "The file is corrupted, truncated or a different version than the one this "
               "library was checked against. Delete it and download it again "
               "(`python -m fedlib data download <dataset>`), or put the original file in its "
               "place. Set FEDLIB_VERIFY=0 to skip verification at your own risk.")
        )


class PartialDataError(FedlibDataError):
    """Only an incomplete copy of a dataset is available and the caller did not opt in."""


class UnsafeArchiveError(FedlibDataError):
    """A downloaded archive with a member that would land outside its target folder.

    Absolute paths, ``..`` components, links and device entries are all refused; nothing
    from such an archive is extracted.
    """


class MalformedDataError(FedlibDataError, ValueError):
    """A line of a raw file that does not match the expected format.

    Attributes:
        path: the file.
        line_number: 1-based line number in the (decompressed) file.
        line: the offending text (truncated to 200 characters).
        reason: what is wrong with it.
    """

    def __init__(self, path: Path, line_number: int, line: str, reason: str):
        self.path = Path(path)
        self.line_number = int(line_number)
        self.line = line if len(line) <= 200 else line[:200] + "..."
        self.reason = reason
        super().__init__(
            f"{self.path.name}, line {self.line_number}: {reason}\n"
            f"  offending text: {self.line!r}\n"
            f"  file: {self.path}\n"
            "The file does not have the published format. It was probably edited or "
            "truncated, or a different file was put under this name: restore the original "
            "(re-download it) or fix that line."
        )


class UnknownProtocolError(FedlibDataError, LookupError):
    """A per-paper protocol name that ``fedlib.data.protocols`` does not know."""

    def __init__(self, protocol: str, known: Sequence[str], dataset: Optional[str] = None):
        self.protocol = protocol
        self.known = tuple(known)
        self.dataset = dataset
        suggestion = closest_match(protocol, self.known)
        hint = f" Did you mean {suggestion!r}?" if suggestion else ""
        scope = f" for dataset {dataset!r}" if dataset else ""
        super().__init__(
            f"Unknown protocol {protocol!r}{scope}.{hint} Known protocols: "
            f"{', '.join(self.known) or '(none)'}. Pass one of them exactly."
        )


class EmptyUserError(FedlibDataError, ValueError):
    """A user (client) left with no interactions where the protocol needs at least one.

    Raised by protocols when filtering or splitting empties a user's train (or test) set;
    the fix is usually a stricter k-core filter or a different split.
    """


def closest_match(word: str, candidates: Sequence[str]) -> Optional[str]:
    """The candidate most similar to ``word`` (case-insensitive), or ``None`` if none is close."""
    lowered = {c.lower(): c for c in candidates}
    hits = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.5)
    if hits:
        return lowered[hits[0]]
    # Substring matches catch short queries such as "lastfm" or "douban".
    contained = [c for c in candidates if word.lower() in c.lower()]
    return contained[0] if contained else None


__all__ = [
    "FedlibDataError",
    "UnknownDatasetError",
    "UnknownVariantError",
    "MissingDataError",
    "ChecksumError",
    "PartialDataError",
    "UnsafeArchiveError",
    "MalformedDataError",
    "UnknownProtocolError",
    "EmptyUserError",
    "closest_match",
]
