"""Finding, verifying and downloading raw dataset files.

The data root
    ``FEDLIB_DATA`` if set, else ``$XDG_CACHE_HOME/fedlib/data`` (``~/.cache/fedlib/data``).
    A dataset lives in ``<root>/<dataset id>/`` with the file names of the registry.

Finding a file (:func:`resolve_file`)
    The exact name is tried first, then the same name plus ``.xz`` or ``.gz`` (and, for a
    name that already ends in one of those, the name without it). The parsers read all of
    them transparently.

Verification
    Every resolved file is checked against the registry's sha256. The digest of each file
    is cached, keyed by absolute path + size + modification time, in ``verified.json`` in
    the *state folder* (``<root>/.fedlib/`` when the root is writable, otherwise a folder
    under the user cache), so a file is hashed once, not on every load. A file or archive
    without a published hash is hashed on first sight and the value recorded in
    ``known_hashes.json`` next to it; later loads and downloads must match it (trust on
    first use). ``FEDLIB_VERIFY=0`` switches verification off.

Downloading
    Only when ``FEDLIB_OFFLINE`` is not ``1`` and the registry has a URL for the file
    (a pinned single-file URL, or the dataset's official archive). The download goes to a
    temporary file in the data root, its sha256 is checked, archives are extracted into a
    temporary folder with every member name validated (no absolute paths, no ``..``, no
    links), and each file is moved into place with an atomic rename. On any failure the
    temporary files are removed: a partial file is never left under a real name.
    Only the standard library is used for HTTP (``urllib``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import ssl
import stat
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence, Tuple

from fedlib.data.errors import ChecksumError, FedlibDataError, MissingDataError, UnsafeArchiveError
from fedlib.data.registry import DatasetSpec, FileSpec, get_spec
from fedlib.data.sources import (AllSourcesFailedError, Source, checksum_failure, fetch_first_verified,
                                 insecure_tls_requested)

ENV_DATA = "FEDLIB_DATA"
ENV_OFFLINE = "FEDLIB_OFFLINE"
ENV_VERIFY = "FEDLIB_VERIFY"

DOWNLOAD_TIMEOUT_S = 30.0
"""Socket timeout of one download (seconds without any data, not the total time)."""

FAILED_DOWNLOAD_RETRY_S = 300.0
"""A URL that failed is not retried within this many seconds in the same process, so that a
machine without network does not wait for a timeout on every load."""

_HASH_CHUNK = 1 << 20
_STATE_DIRNAME = ".fedlib"
_VERIFIED_FILE = "verified.json"
_KNOWN_HASHES_FILE = "known_hashes.json"
_JUNK_MEMBERS = ("__MACOSX", ".DS_Store")

# In-process memo of file digests: (absolute path, size, mtime_ns) -> sha256.
_DIGEST_MEMO: Dict[Tuple[str, int, int], str] = {}
# (URL, without certificate checks) -> (time of failure, the error), see FAILED_DOWNLOAD_RETRY_S.
_FAILED_URLS: Dict[Tuple[str, bool], Tuple[float, BaseException]] = {}


# ----------------------------------------------------------------------------------------
# Locations and switches
# ----------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedlib`` (default ``~/.cache/fedlib``)."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "fedlib"


def data_root(root: "str | os.PathLike | None" = None) -> Path:
    """The data root: ``root`` if given, else ``FEDLIB_DATA``, else ``<cache_dir>/data``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(ENV_DATA, "").strip()
    if env:
        return Path(env).expanduser()
    return cache_dir() / "data"


def describe_root(root: "str | os.PathLike | None" = None) -> str:
    """Where the data root came from, for messages (``'/x (from FEDLIB_DATA)'``)."""
    resolved = data_root(root)
    if root is not None:
        origin = "passed as root="
    elif os.environ.get(ENV_DATA, "").strip():
        origin = f"from {ENV_DATA}"
    else:
        origin = f"default; {ENV_DATA} is not set"
    return f"{resolved} ({origin})"


def downloads_allowed() -> bool:
    """False when ``FEDLIB_OFFLINE`` is ``1``/``true``/``yes``."""
    return os.environ.get(ENV_OFFLINE, "").strip().lower() not in ("1", "true", "yes", "on")


def verification_enabled() -> bool:
    """False when ``FEDLIB_VERIFY`` is ``0``/``false``/``no``."""
    return os.environ.get(ENV_VERIFY, "").strip().lower() not in ("0", "false", "no", "off")


def state_dir(root: "str | os.PathLike | None" = None, *, create: bool = False) -> Path:
    """Folder for ``verified.json`` and ``known_hashes.json`` of one data root.

    ``<root>/.fedlib`` when the root is writable (the records travel with the data);
    otherwise ``<cache_dir>/state/<digest of the root path>`` (a read-only shared copy).
    """
    resolved = data_root(root).resolve()
    inside = resolved / _STATE_DIRNAME
    if inside.is_dir() and os.access(inside, os.W_OK):
        chosen = inside
    elif resolved.is_dir() and os.access(resolved, os.W_OK):
        chosen = inside
    else:
        tag = hashlib.sha256(str(resolved).encode()).hexdigest()[:16]
        chosen = cache_dir() / "state" / tag
    if create:
        chosen.mkdir(parents=True, exist_ok=True)
    return chosen


# ----------------------------------------------------------------------------------------
# Small JSON stores (written atomically)
# ----------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        # A missing or corrupted cache only costs a re-hash; never fail a load because of it.
        return {}


def _write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _known_hashes(root: Path) -> dict:
    data = _read_json(state_dir(root) / _KNOWN_HASHES_FILE)
    data.setdefault("files", {})
    data.setdefault("urls", {})
    return data


def recorded_hash(root: Path, *, file: Optional[str] = None, url: Optional[str] = None) -> Optional[str]:
    """The hash recorded on first use for a file (relative path) or URL, if any."""
    data = _known_hashes(root)
    if file is not None:
        return data["files"].get(file)
    return data["urls"].get(url)


def _record_hash(root: Path, *, file: Optional[str] = None, url: Optional[str] = None, sha256: str) -> Path:
    store = state_dir(root) / _KNOWN_HASHES_FILE
    data = _known_hashes(root)
    if file is not None:
        data["files"][file] = sha256
    if url is not None:
        data["urls"][url] = sha256
    try:
        _write_json_atomic(store, data)  # creates the state folder if needed
    except OSError as exc:  # not fatal: the next run simply records again
        print(f"fedlib: could not record sha256 in {store}: {exc}", file=sys.stderr)
    return store


# ----------------------------------------------------------------------------------------
# Hashing with a persistent cache
# ----------------------------------------------------------------------------------------

def sha256_of(path: "str | os.PathLike") -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_sha256(path: Path, root: Path) -> str:
    """sha256 of ``path``, reusing a digest cached for the same path, size and mtime."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _DIGEST_MEMO:
        return _DIGEST_MEMO[key]
    store = state_dir(root) / _VERIFIED_FILE
    cache = _read_json(store)
    entry = cache.get(str(path))
    if isinstance(entry, list) and len(entry) == 3 and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
        digest = str(entry[2])
    else:
        digest = sha256_of(path)
        cache[str(path)] = [st.st_size, st.st_mtime_ns, digest]
        try:
            _write_json_atomic(store, cache)
        except OSError:
            pass  # an unwritable cache only means hashing again next time
    _DIGEST_MEMO[key] = digest
    return digest


# ----------------------------------------------------------------------------------------
# Locating files
# ----------------------------------------------------------------------------------------

def normalise_relpath(spec: DatasetSpec, relpath: str) -> str:
    """``relpath`` as a path under the data root: ``'u.data'`` -> ``'ml-100k/u.data'``.

    Paths already starting with the dataset folder are kept. Absolute paths and ``..``
    are refused (ValueError).
    """
    text = str(relpath).replace("\\", "/")
    if text.startswith("/") or re.match(r"^[A-Za-z]:", text):
        raise ValueError(f"expected a path relative to the data root, got {relpath!r}")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise ValueError(f"invalid relative path {relpath!r}")
    if parts[0] != spec.id:
        parts.insert(0, spec.id)
    return "/".join(parts)


def _candidates(relpath: str) -> List[str]:
    """Names a file may be stored under, in order of preference."""
    names = [relpath]
    for suffix in (".xz", ".gz"):
        if relpath.endswith(suffix):
            names.append(relpath[: -len(suffix)])
    names += [relpath + ".xz", relpath + ".gz"]
    return names


def find_file(dataset: "str | DatasetSpec", relpath: str, root: "str | os.PathLike | None" = None) -> Optional[Path]:
    """The stored copy of ``relpath`` (exact, ``.xz`` or ``.gz``), or ``None``. No download, no hashing."""
    spec = get_spec(dataset)
    base = data_root(root)
    rel = normalise_relpath(spec, relpath)
    for name in _candidates(rel):
        candidate = base / name
        if candidate.is_file():
            return candidate
    return None


def present_files(dataset: "str | DatasetSpec", root: "str | os.PathLike | None" = None) -> Tuple[str, ...]:
    """Registered stored paths of ``dataset`` that exist (in any accepted form) under the root."""
    spec = get_spec(dataset)
    return tuple(f.path for f in spec.files if find_file(spec, f.path, root) is not None)


def dataset_status(dataset: "str | DatasetSpec", root: "str | os.PathLike | None" = None) -> str:
    """Status computed from the files present under the data root (presence only, no hashing)."""
    spec = get_spec(dataset)
    return spec.status_for(present_files(spec, root))


def verify_file(dataset: "str | DatasetSpec", path: "str | os.PathLike", root: "str | os.PathLike | None" = None) -> str:
    """Check one stored file against its expected sha256; return the digest.

    Expected value: the registry's hash for that exact stored name; for a form the registry
    has no hash for (a file without reference copy, an uncompressed ``u1.base`` instead of
    ``u1.base.xz``, an official copy whose bytes are known to differ), the hash recorded on
    first use; if none is recorded yet, the digest is recorded now.

    Raises:
        ChecksumError: digest differs from the expected one.
    """
    spec = get_spec(dataset)
    base = data_root(root)
    path = Path(path)
    try:
        rel = path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        rel = path.name
    registered = next((f for f in spec.files if f.path == rel), None)
    expected = registered.sha256 if registered is not None else None
    source = "the fedlib registry"
    if (expected is not None and registered.upstream_differs and registered.size is not None
            and path.stat().st_size != registered.size):
        # The official copy differs from the reference copy by design (see FileSpec).
        expected = None
    if expected is None:
        expected = recorded_hash(base, file=rel)
        source = f"the hash recorded on first use in {state_dir(base) / _KNOWN_HASHES_FILE}"
    actual = cached_sha256(path, base)
    if expected is None:
        store = _record_hash(base, file=rel, sha256=actual)
        print(f"fedlib: {rel} has no published sha256; recorded {actual} in {store} "
              "(later loads are checked against it).", file=sys.stderr)
        return actual
    if actual != expected:
        raise ChecksumError(
            path, expected, actual,
            advice=(f"Expected value from {source}. The file is corrupted, truncated or a different "
                    f"version. Delete {path} and run `python -m fedlib data download {spec.id}` (or copy "
                    "the original file back); if you replaced the file on purpose, delete its entry in "
                    f"{state_dir(base) / _KNOWN_HASHES_FILE}. FEDLIB_VERIFY=0 skips verification at your own risk."),
        )
    return actual


def resolve_file(
    dataset: "str | DatasetSpec",
    relpath: str,
    root: "str | os.PathLike | None" = None,
    *,
    download: Optional[bool] = None,
    verify: bool = True,
) -> Path:
    """Path of a verified copy of ``relpath``, downloading it first if needed and allowed.

    Args:
        dataset: registry id (or a :class:`DatasetSpec`).
        relpath: path under the data root (``'ml-100k/u1.base'``) or under the dataset
            folder (``'u1.base'``); the ``.xz``/``.gz`` forms are accepted transparently.
        root: data root; ``None`` uses :func:`data_root`.
        download: ``False`` never downloads; ``None`` downloads unless ``FEDLIB_OFFLINE=1``.
        verify: check the sha256 (skipped anyway when ``FEDLIB_VERIFY=0``).

    Raises:
        MissingDataError: absent, and downloading is off, impossible (manual-only) or failed.
        ChecksumError: present but with the wrong sha256.
    """
    spec = get_spec(dataset)
    base = data_root(root)
    rel = normalise_relpath(spec, relpath)
    found = find_file(spec, rel, base)
    if found is None:
        want_download = downloads_allowed() if download is None else (download and downloads_allowed())
        reason = _obtain(spec, rel, base) if want_download else _not_downloaded_reason(download)
        found = find_file(spec, rel, base)
        if found is None:
            raise MissingDataError(missing_data_message(spec, [rel], base, reason, root_given=root),
                                   dataset=spec.id, missing=[rel], root=base)
    if verify and verification_enabled():
        verify_file(spec, found, base)
    return found


def _not_downloaded_reason(download: Optional[bool]) -> str:
    if not downloads_allowed():
        return f"downloads are off ({ENV_OFFLINE}={os.environ.get(ENV_OFFLINE)})"
    return "this call does not download (download=False)"


# ----------------------------------------------------------------------------------------
# Messages
# ----------------------------------------------------------------------------------------

def missing_data_message(spec: DatasetSpec, missing: Sequence[str], root: Path, reason: Optional[str],
                         *, root_given=None) -> str:
    """The text of a :class:`MissingDataError`: what is missing, where we looked, how to get it."""
    root = Path(root)
    lines = [f"{spec.title} ({spec.id}): missing file(s): {', '.join(missing)}"]
    for rel in missing:
        lines.append(f"  looked for: {root / rel} (also with .xz / .gz)")
    lines.append(f"  data root searched: {describe_root(root_given)}")
    lines.append(f"  to use another folder: set {ENV_DATA}=/path/to/data (the folder that contains '{spec.id}/').")
    if reason:
        lines.append(f"  not downloaded: {reason}")
    files = [spec.file(rel) for rel in missing]
    automatic = [f for f in files if f is not None and (f.source_urls or (spec.archive is not None and f.in_archive))]
    manual = [rel for rel, f in zip(missing, files) if f is None or f not in automatic]
    if automatic:
        sources = sorted({u for f in automatic for u in f.urls[:1]}
                         | ({spec.archive.url} if spec.archive and any(not f.urls for f in automatic) else set()))
        offline_hint = f" (unset {ENV_OFFLINE} first)" if not downloads_allowed() else ""
        lines.append(f"  download by script{offline_hint}: python -m fedlib data download {spec.id}")
        lines.append(f"    from: {', '.join(sources)}")
    if manual or (automatic and spec.manual):
        text = spec.manual_instructions(root)
        if text:
            lines.append(f"  manual download: {text}")
    lines.append(f"  canonical source: {spec.url}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Downloading
# ----------------------------------------------------------------------------------------

def _fetch(url: str, dest: Path, *, timeout: float = DOWNLOAD_TIMEOUT_S,
           context: Optional[ssl.SSLContext] = None) -> str:
    """Stream ``url`` into ``dest`` (created or truncated); return the sha256 of the bytes.

    ``context`` replaces the default TLS context (only the hash-pinned insecure retry of
    :mod:`fedlib.data.sources` passes one). Raises ``OSError`` (``urllib.error.URLError``
    is one) on network errors and on a body shorter than its announced ``Content-Length``.
    Tests replace this function to simulate failures; ``file://`` URLs work as they are.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "fedlib-data-download/1"})
    digest = hashlib.sha256()
    written = 0
    extra = {} if context is None else {"context": context}
    with urllib.request.urlopen(request, timeout=timeout, **extra) as response, open(dest, "wb") as out:
        announced = response.headers.get("Content-Length")
        for chunk in iter(lambda: response.read(_HASH_CHUNK), b""):
            digest.update(chunk)
            out.write(chunk)
            written += len(chunk)
    if announced is not None and announced.isdigit() and written != int(announced):
        raise OSError(f"truncated download from {url}: {written} of {announced} bytes")
    return digest.hexdigest()


def _fetch_checked(url: str, dest: Path, context: Optional[ssl.SSLContext] = None) -> str:
    """:func:`_fetch` with a short-lived memory of failed URLs (see FAILED_DOWNLOAD_RETRY_S).

    The memory is kept per URL and TLS mode, so a retry without certificate checks is not
    blocked by the verified attempt that just failed.
    """
    key = (url, context is not None)
    failed = _FAILED_URLS.get(key)
    if failed is not None and time.monotonic() - failed[0] < FAILED_DOWNLOAD_RETRY_S:
        raise failed[1]
    print(f"fedlib: downloading {url}", file=sys.stderr)
    try:
        return _fetch(url, dest) if context is None else _fetch(url, dest, context=context)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        _FAILED_URLS[key] = (time.monotonic(), exc)
        raise


def _announce_recorded(url: str, sha: str, store: Path) -> None:
    print(f"fedlib: no published sha256 for {url}; the download has sha256 {sha}. Recorded in {store}; "
          "later downloads are checked against it.", file=sys.stderr)


def _sources(urls: Sequence[str], mirrors: Sequence[str]) -> List[Source]:
    return [Source(u) for u in urls] + [Source(u, mirror=True) for u in mirrors]


def _manual_steps(spec: DatasetSpec, root: Path, what: str, sources: Sequence[Source], pinned: Optional[str]) -> str:
    text = spec.manual_instructions(root)
    if not text:
        urls = " or ".join(s.url for s in sources) or spec.url
        text = f"download {urls} by hand and save it as {root / what}"
    if pinned:
        text += f" Check the download with `sha256sum`: it must print {pinned}."
    return text


def _download_verified(spec: DatasetSpec, root: Path, what: str, sources: Sequence[Source], dest: Path,
                       pinned: Optional[str], insecure_tls_if_hash_pinned: Optional[bool]) -> Tuple[Source, str]:
    """Fetch ``what`` from the first acceptable source into ``dest``; errors name every source.

    Raises:
        ChecksumError: no source served the right bytes and at least one served wrong ones.
        AllSourcesFailedError: every source failed for network, TLS or HTTP reasons.
    """
    try:
        source, actual, _ = fetch_first_verified(
            sources, dest, _fetch_checked,
            expected=lambda s: pinned or recorded_hash(root, url=s.url), pinned=pinned is not None,
            insecure_tls_if_hash_pinned=insecure_tls_requested(insecure_tls_if_hash_pinned))
        return source, actual
    except AllSourcesFailedError as exc:
        manual = _manual_steps(spec, root, what, sources, pinned)
        mismatched = [f for f in exc.failures if f.hash_mismatch]
        if mismatched:
            expected = pinned or recorded_hash(root, url=mismatched[-1].source.url) or ""
            raise checksum_failure(what, exc.failures, expected, root, manual) from None
        raise AllSourcesFailedError(what, exc.failures, root, manual) from None


def download_file(spec: DatasetSpec, file: FileSpec, root: Path, *, force: bool = False,
                  insecure_tls_if_hash_pinned: Optional[bool] = None) -> Path:
    """Download one registered single file (``file.urls``, then ``file.mirrors``) into ``root``.

    The sources are tried in order (see :mod:`fedlib.data.sources`). The bytes go to a
    temporary file next to the target and are renamed into place only after their sha256
    matched the registry (or, with no published hash, after it was recorded).

    Raises:
        ChecksumError: no source served the expected bytes (nothing is kept).
        AllSourcesFailedError (an ``OSError``): every source failed; names each one.
    """
    root = Path(root)
    target = root / file.path
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        source, actual = _download_verified(spec, root, file.path, _sources(file.urls, file.mirrors), tmp,
                                            file.sha256, insecure_tls_if_hash_pinned)
        if file.sha256 is None and recorded_hash(root, url=source.url) is None:
            store = _record_hash(root, url=source.url, sha256=actual)
            _record_hash(root, file=file.path, sha256=actual)
            _announce_recorded(source.url, actual, store)
        os.replace(tmp, target)
        return target
    finally:
        tmp.unlink(missing_ok=True)


def _check_extracted(spec: DatasetSpec, staging: Path, members: Sequence[str], archive_url: str) -> None:
    """Compare extracted members with the registry's pinned hashes of the same files.

    Only members stored under the same name as a registered file with a pinned hash are
    compared (``u1.base`` is stored as ``u1.base.xz``, a different file); a file whose
    reference copy differs from the upstream form (``upstream_differs``) is skipped.
    """
    for member in members:
        registered = next((f for f in spec.files if f.path == f"{spec.id}/{member}"), None)
        if registered is None or registered.sha256 is None or registered.upstream_differs:
            continue
        actual = sha256_of(staging / member)
        if actual != registered.sha256:
            raise ChecksumError(f"{member} in {archive_url}", registered.sha256, actual, advice=(
                "The archive's hash was accepted but this member differs from the copy fedlib was checked "
                "against, so nothing was extracted. Report it; meanwhile copy the file by hand."))


def download_archive(spec: DatasetSpec, root: Path, *, force: bool = False,
                     insecure_tls_if_hash_pinned: Optional[bool] = None) -> List[str]:
    """Download and safely extract ``spec.archive`` into ``<root>/<spec.id>/``.

    The archive's sources (``url``, then ``mirrors`` when its hash is pinned) are tried in
    order. A single top-level folder in the archive (``ml-100k/`` in ``ml-100k.zip``) is
    stripped, so files land at ``<root>/<spec.id>/<name>`` whatever the archive's layout.
    Extracted members with a pinned hash in the registry are checked too. Existing files
    are kept unless ``force``; nothing is written unless every check passed.

    Returns:
        Paths (relative to the root) of the files written.

    Raises:
        ChecksumError: the archive (or a registered member) does not match its hash.
        UnsafeArchiveError: a member would escape the target folder (nothing is written).
        AllSourcesFailedError / OSError: network or disk errors.
    """
    if spec.archive is None:
        raise FedlibDataError(f"{spec.id} has no downloadable archive")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fedlib-download-", dir=root))
    try:
        archive_path = work / "archive"
        source, actual = _download_verified(
            spec, root, spec.archive.url.rsplit("/", 1)[-1], _sources((spec.archive.url,), spec.archive.mirrors),
            archive_path, spec.archive.sha256, insecure_tls_if_hash_pinned)
        staging = work / "extracted"
        members = extract_archive(archive_path, staging, spec.archive.format)
        _check_extracted(spec, staging, members, source.url)
        if spec.archive.sha256 is None and recorded_hash(root, url=source.url) is None:
            # Record only after a successful, safe extraction: a broken archive must not be trusted.
            _announce_recorded(source.url, actual, _record_hash(root, url=source.url, sha256=actual))
        written = []
        target_dir = root / spec.id
        for member in members:
            destination = target_dir / member
            if destination.exists() and not force:
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / member, destination)
            written.append(f"{spec.id}/{member}")
        return written
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _member_parts(name: str) -> List[str]:
    """Validated path components of an archive member name (raises UnsafeArchiveError)."""
    text = name.replace("\\", "/")
    if text.startswith("/") or re.match(r"^[A-Za-z]:", text):
        raise UnsafeArchiveError(f"archive member {name!r} has an absolute path; refusing to extract the archive")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"archive member {name!r} contains '..'; refusing to extract the archive")
    return parts


def extract_archive(archive: Path, destination: Path, fmt: str = "zip") -> List[str]:
    """Extract regular files of a zip or tar archive into ``destination``, safely.

    Every member is validated before anything is written: absolute paths, ``..``
    components, symbolic or hard links and special files make the whole archive refused.
    Junk entries (``__MACOSX/``, ``.DS_Store``) are skipped. A single top-level folder
    shared by all files is stripped.

    Returns:
        POSIX paths of the extracted files, relative to ``destination``.
    """
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    entries: List[Tuple[List[str], object]] = []
    if fmt == "zip":
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                parts = _member_parts(info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise UnsafeArchiveError(f"archive member {info.filename!r} is a symbolic link; refusing to extract")
                if info.is_dir() or not parts or parts[0] in _JUNK_MEMBERS or parts[-1] in _JUNK_MEMBERS:
                    continue
                entries.append((parts, info))
            _write_members(entries, destination, lambda info: zf.open(info))
    elif fmt == "tar":
        with tarfile.open(archive, "r:*") as tf:
            for member in tf.getmembers():
                parts = _member_parts(member.name)
                if member.issym() or member.islnk():
                    raise UnsafeArchiveError(f"archive member {member.name!r} is a link; refusing to extract")
                if member.isdir() or not parts or parts[0] in _JUNK_MEMBERS or parts[-1] in _JUNK_MEMBERS:
                    continue
                if not member.isfile():
                    raise UnsafeArchiveError(f"archive member {member.name!r} is not a regular file; refusing to extract")
                entries.append((parts, member))
            _write_members(entries, destination, lambda member: tf.extractfile(member))
    else:
        raise ValueError(f"unknown archive format {fmt!r} (expected 'zip' or 'tar')")
    return [str(PurePosixPath(*parts)) for parts in _strip_common_top(entries)]


def _strip_common_top(entries) -> List[List[str]]:
    parts_list = [parts for parts, _ in entries]
    tops = {parts[0] for parts in parts_list}
    if len(tops) == 1 and all(len(parts) >= 2 for parts in parts_list):
        return [parts[1:] for parts in parts_list]
    return parts_list


def _write_members(entries, destination: Path, opener) -> None:
    stripped = _strip_common_top(entries)
    base = destination.resolve()
    for (parts, member), rel_parts in zip(entries, stripped):
        target = destination.joinpath(*rel_parts)
        # Defence in depth: the validated name must still resolve inside the destination.
        if base not in target.resolve().parents:
            raise UnsafeArchiveError(f"archive member {'/'.join(parts)!r} escapes the extraction folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        with opener(member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, _HASH_CHUNK)


def _obtain(spec: DatasetSpec, rel: str, root: Path) -> Optional[str]:
    """Try to download the file ``rel``; return the reason if it could not be (else ``None``)."""
    file = spec.file(rel)
    if file is None:
        return "the file is not in the fedlib registry, so there is nothing to download it from"
    errors = []
    try:
        if file.source_urls:
            download_file(spec, file, root)
            return None
        if spec.archive is not None and file.in_archive:
            download_archive(spec, root)
            if find_file(spec, rel, root) is None:
                return f"the archive {spec.archive.url} was downloaded but does not contain {rel}"
            return None
    except (ChecksumError, UnsafeArchiveError):
        raise
    except PermissionError as exc:
        errors.append(f"the data root is not writable ({exc}); set {ENV_DATA} to a writable folder")
    except (OSError, urllib.error.URLError, ValueError) as exc:
        errors.append(f"download failed: {exc}")
    if errors:
        return "; ".join(errors)
    return "it is only available by manual download"


@dataclass
class DownloadReport:
    """What :func:`download_dataset` did.

    Attributes:
        dataset: registry id.
        written: relative paths written by this call.
        already_present: registered files that were already there.
        manual: files that can only be fetched by hand (see ``instructions``).
        failed: ``relpath: reason`` for downloads that failed.
        instructions: manual instructions (empty when none are needed).
    """

    dataset: str
    written: List[str] = field(default_factory=list)
    already_present: List[str] = field(default_factory=list)
    manual: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)
    instructions: str = ""

    @property
    def ok(self) -> bool:
        return not self.failed


def download_dataset(dataset: "str | DatasetSpec", root: "str | os.PathLike | None" = None, *,
                     force: bool = False, insecure_tls_if_hash_pinned: Optional[bool] = None) -> DownloadReport:
    """Fetch every missing file of ``dataset`` that can be fetched by script.

    Each file's sources are tried in order (canonical, then mirrors); every failed source
    is reported on stderr in one line. ``insecure_tls_if_hash_pinned`` (default: the
    ``FEDLIB_INSECURE_TLS_IF_HASH_PINNED`` variable) accepts a host with a broken TLS
    certificate for files whose sha256 is pinned, with a loud warning.

    Raises:
        MissingDataError: downloads are switched off (``FEDLIB_OFFLINE=1``).
        ChecksumError / UnsafeArchiveError: a download failed verification.
    """
    spec = get_spec(dataset)
    base = data_root(root)
    missing = [f for f in spec.files if f.in_full and (force or find_file(spec, f.path, base) is None)]
    report = DownloadReport(dataset=spec.id)
    report.already_present = [f.path for f in spec.files if f not in missing and find_file(spec, f.path, base)]
    if not missing:
        return report
    if not downloads_allowed():
        raise MissingDataError(
            missing_data_message(spec, [f.path for f in missing], base,
                                 f"downloads are off ({ENV_OFFLINE}={os.environ.get(ENV_OFFLINE)})", root_given=root),
            dataset=spec.id, missing=[f.path for f in missing], root=base)
    base.mkdir(parents=True, exist_ok=True)
    archive_needed = [f for f in missing if not f.source_urls and spec.archive is not None and f.in_archive]
    for f in missing:
        if not f.source_urls:
            continue
        try:
            download_file(spec, f, base, force=force, insecure_tls_if_hash_pinned=insecure_tls_if_hash_pinned)
            report.written.append(f.path)
        except (OSError, urllib.error.URLError) as exc:
            report.failed.append(f"{f.path}: {exc}")
    if archive_needed:
        try:
            report.written += download_archive(spec, base, force=force,
                                               insecure_tls_if_hash_pinned=insecure_tls_if_hash_pinned)
        except (OSError, urllib.error.URLError) as exc:
            names = ", ".join(f.path for f in archive_needed)
            report.failed.append(f"{names} (from the archive): {exc}")
    for f in missing:
        if not f.source_urls and not (spec.archive is not None and f.in_archive):
            report.manual.append(f.path)
    if report.manual:
        report.instructions = spec.manual_instructions(base)
    return report


__all__ = [
    "ENV_DATA",
    "ENV_OFFLINE",
    "ENV_VERIFY",
    "DownloadReport",
    "cache_dir",
    "data_root",
    "describe_root",
    "downloads_allowed",
    "verification_enabled",
    "state_dir",
    "sha256_of",
    "cached_sha256",
    "normalise_relpath",
    "find_file",
    "present_files",
    "dataset_status",
    "verify_file",
    "resolve_file",
    "missing_data_message",
    "download_file",
    "download_archive",
    "extract_archive",
    "download_dataset",
    "recorded_hash",
]
