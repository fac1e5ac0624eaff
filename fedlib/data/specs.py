"""What a dataset entry says: its files, variants, archives and status, as frozen dataclasses.

The catalogue of datasets itself is :mod:`fedlib.data.registry`; the status vocabulary is
described there.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

from fedlib.data.errors import UnknownVariantError

__all__ = ["STATUSES", "INTERACTION_ROLES", "COMPRESSION_SUFFIXES", "FileSpec", "VariantSpec", "ArchiveSpec", "DatasetSpec"]


STATUSES = ("complete", "partial", "processed", "substitute", "metadata-only", "missing")
"""Every status value, from best to worst."""

INTERACTION_ROLES = ("interactions", "sequences", "partial-interactions", "split")
"""File roles that carry user-item interactions (used to tell ``partial`` from ``metadata-only``)."""

COMPRESSION_SUFFIXES = {".xz": "xz", ".gz": "gzip"}
"""Transparent-compression suffixes understood by the resolver and the parsers."""


@dataclass(frozen=True)
class FileSpec:
    """One raw file of a dataset.

    Attributes:
        path: relative path under the data root, exactly as the reference collection stores
            it (forward slashes), e.g. ``"ml-100k/u1.base.xz"``.
        sha256: hex digest of that stored file, or ``None`` if no reference copy exists.
        size: byte size of the stored file, or ``None``.
        role: ``interactions`` / ``split`` / ``sequences`` / ``partial-interactions`` /
            ``timestamps`` / ``metadata`` / ``item-list`` / ``docs``.
        compression: ``"xz"`` / ``"gzip"`` when the stored file is compressed, else ``None``.
        urls: direct download locations of this single file from its publisher (tried in
            order); a file without ``sha256`` gets its hash recorded on first download.
        mirrors: third-party copies, tried after ``urls`` and only when ``sha256`` is pinned
            (a mirror is only ever trusted through the pinned hash).
        in_archive: whether the dataset's archive (:attr:`DatasetSpec.archive`) contains it.
        in_full: whether it counts towards ``complete`` (``False`` for stand-in copies such
            as ml-1m's partial ratings).
        upstream_differs: set when the official distribution's bytes differ from the
            reference copy (header removed, line endings changed). A file whose size differs
            from ``size`` is then treated as the upstream form: its hash is recorded on first
            use instead of being compared with ``sha256``.
    """

    path: str
    sha256: Optional[str]
    size: Optional[int]
    role: str
    compression: Optional[str] = None
    urls: Tuple[str, ...] = ()
    in_archive: bool = True
    in_full: bool = True
    upstream_differs: Optional[str] = None
    mirrors: Tuple[str, ...] = ()

    @property
    def source_urls(self) -> Tuple[str, ...]:
        """Every download location in the order tried: ``urls`` then ``mirrors``."""
        return (*self.urls, *self.mirrors)

    @property
    def logical_path(self) -> str:
        """The name loaders ask for: ``ml-100k/u1.base`` for the stored ``u1.base.xz``.

        Only the ``.xz`` storage compression of the reference collection is stripped; a
        ``.gz`` that is the file's published form (ml-1m's partial copy, Amazon's json.gz)
        keeps its name.
        """
        if self.compression == "xz" and self.path.endswith(".xz"):
            return self.path[: -len(".xz")]
        return self.path


@dataclass(frozen=True)
class VariantSpec:
    """A named way of loading a dataset.

    Attributes:
        name: the ``variant=`` value (``None`` for the default of single-variant datasets).
        description: one line for listings and docstrings.
        required: logical paths the loader cannot do without.
        optional: logical paths used when present (their absence is reported in ``notes``).
    """

    name: Optional[str]
    description: str
    required: Tuple[str, ...]
    optional: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ArchiveSpec:
    """A downloadable archive holding (some of) the dataset's files.

    Attributes:
        url: download location (``https://`` or, in tests, ``file://``).
        sha256: expected digest of the archive, ``None`` when not known yet: it is then
            computed, printed and recorded on the first download, and later downloads are
            checked against the recorded value.
        format: ``"zip"``, ``"tar"`` (any compression tarfile understands).
        mirrors: byte-identical third-party copies, tried after ``url``; only used when
            ``sha256`` is pinned.
        size: byte size of the archive when known (for the README and ``data doctor``).
        hash_source: where the pinned ``sha256`` was published (provenance of the pin).
    """

    url: str
    sha256: Optional[str] = None
    format: str = "zip"
    mirrors: Tuple[str, ...] = ()
    size: Optional[int] = None
    hash_source: str = ""

    @property
    def source_urls(self) -> Tuple[str, ...]:
        """Every download location in the order tried: ``url`` then ``mirrors``."""
        return (self.url, *self.mirrors)


@dataclass(frozen=True)
class DatasetSpec:
    """Everything the data layer knows about one dataset.

    Attributes:
        id: registry id, also the folder name under the data root.
        title: human-readable name.
        status: status of the reference collection (see module docstring).
        full_status: status when every ``in_full`` file is present: ``complete`` for original
            data, ``processed`` / ``substitute`` for third-party processed copies.
        files: every registered file.
        variants: the loader variants; ``default_variant`` is used for ``variant=None``.
        url: canonical home page or download URL.
        archive: official archive for scripted download, or ``None``.
        manual: step-by-step manual download instructions (``{root}`` is replaced by the
            data root), or ``None`` when everything can be downloaded by script.
        licence: licence / terms of use (short but complete).
        licence_short: a few words for tables.
        parser: name of the loader function in :mod:`fedlib.data.loaders` (a name, not the
            function: the loaders import this registry, so it must not import them).
        kind: ``"interactions"`` (use ``load_interactions``) or ``"sequences"``
            (use ``load_sequences``).
        provenance: where the reference copy came from (repository @ commit, path).
        figures: figures verified on the reference copy.
        notes: caveats of the dataset itself (the loaders add their own).
    """

    id: str
    title: str
    status: str
    full_status: str
    files: Tuple[FileSpec, ...]
    variants: Tuple[VariantSpec, ...]
    url: str
    licence: str
    licence_short: str
    parser: str
    default_variant: Optional[str] = None
    archive: Optional[ArchiveSpec] = None
    manual: Optional[str] = None
    kind: str = "interactions"
    provenance: str = ""
    figures: str = ""
    notes: Tuple[str, ...] = ()

    # -- files -------------------------------------------------------------------------
    def file(self, relpath: str) -> Optional[FileSpec]:
        """The registered file whose stored or logical path is ``relpath`` (else ``None``)."""
        for spec in self.files:
            if relpath in (spec.path, spec.logical_path):
                return spec
        return None

    @property
    def script_downloadable(self) -> bool:
        """True when every ``in_full`` file can be fetched without a browser."""
        return all(self._downloadable(f) for f in self.files if f.in_full)

    def _downloadable(self, f: FileSpec) -> bool:
        return bool(f.urls or f.mirrors) or (self.archive is not None and f.in_archive)

    @property
    def manual_files(self) -> Tuple[FileSpec, ...]:
        """Files that can only be obtained by hand."""
        return tuple(f for f in self.files if f.in_full and not self._downloadable(f))

    # -- variants ----------------------------------------------------------------------
    @property
    def variant_names(self) -> Tuple[Optional[str], ...]:
        return tuple(v.name for v in self.variants)

    def variant(self, name: Optional[str]) -> VariantSpec:
        """The :class:`VariantSpec` for ``name`` (``None`` selects the default)."""
        wanted = self.default_variant if name is None else name
        for v in self.variants:
            if v.name == wanted:
                return v
        raise UnknownVariantError(self.id, name, self.variant_names)

    # -- status ------------------------------------------------------------------------
    def status_for(self, present: Iterable[str]) -> str:
        """Status given the set of present files (stored or logical paths).

        Rules, in order: nothing present -> ``missing``; every ``in_full`` file present ->
        ``full_status``; some interaction-bearing file present -> ``partial`` (but a
        ``processed``/``substitute`` dataset keeps that label, the stronger caveat);
        otherwise ``metadata-only``.
        """
        present = set(present)

        def here(f: FileSpec) -> bool:
            return f.path in present or f.logical_path in present

        if not any(here(f) for f in self.files):
            return "missing"
        if all(here(f) for f in self.files if f.in_full):
            return self.full_status
        if any(here(f) for f in self.files if f.role in INTERACTION_ROLES):
            return self.full_status if self.full_status in ("processed", "substitute") else "partial"
        return "metadata-only"

    def manual_instructions(self, root: str = "<data root>") -> str:
        """Manual instructions with ``{root}`` filled in (empty string if there are none)."""
        return (self.manual or "").replace("{root}", str(root))
