"""Trying a file's download sources in order, and saying what happened at each one.

A registered file (or archive) has *sources*: its canonical URLs first, then its mirrors.
:func:`fetch_first_verified` tries them in order. A network, TLS or HTTP error, or bytes
whose sha256 differs from the expected one, is a failure of that source: it is reported
in one line (``host: reason``) on stderr and the next source is tried. Bytes are accepted
only when their sha256 matches the expected value (the registry's pinned hash, or the
hash recorded on first use for that URL).

Trust rules
    * A *mirror* is only ever trusted through a hash pinned in the registry: without one
      it is skipped (a mirror cannot be used to record a first-use hash).
    * A host whose TLS certificate is not accepted (expired, self-signed, wrong name) is a
      failure, unless the caller passes ``insecure_tls_if_hash_pinned`` (or sets
      ``FEDLIB_INSECURE_TLS_IF_HASH_PINNED=1``) *and* the file's hash is pinned: the same
      host is then read once more without certificate checks, with a loud warning, and
      its bytes still have to match the pinned hash.

When every source fails the caller raises :class:`AllSourcesFailedError` (or a
:class:`~fedlib.data.errors.ChecksumError` when some source served wrong bytes), whose
message lists every source with its reason, the data root and the manual steps.
"""
from __future__ import annotations

import os
import socket
import ssl
import sys
import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from fedlib.data.errors import ChecksumError, FedlibDataError

ENV_INSECURE_TLS = "FEDLIB_INSECURE_TLS_IF_HASH_PINNED"

FetchFunction = Callable[[str, Path, Optional[ssl.SSLContext]], str]
"""``fetch(url, dest, tls_context)`` streams ``url`` into ``dest`` and returns the sha256
of the bytes; ``tls_context`` is ``None`` for the default (verifying) context."""


@dataclass(frozen=True)
class Source:
    """One place a file can be downloaded from.

    Attributes:
        url: the download URL.
        mirror: ``True`` for a third-party copy (only trusted through a pinned hash).
    """

    url: str
    mirror: bool = False

    @property
    def host(self) -> str:
        return host_of(self.url)


@dataclass(frozen=True)
class SourceFailure:
    """Why one source was not used.

    Attributes:
        source: the source that failed.
        reason: one line, e.g. ``"TLS certificate not accepted (certificate has expired)"``.
        actual_sha256: the digest of the bytes it served, when they were refused for a hash
            mismatch (else ``None``).
    """

    source: Source
    reason: str
    actual_sha256: Optional[str] = None

    @property
    def hash_mismatch(self) -> bool:
        return self.actual_sha256 is not None

    def line(self) -> str:
        kind = "mirror" if self.source.mirror else "source"
        return f"{self.source.host} ({kind} {self.source.url}): {self.reason}"


class AllSourcesFailedError(FedlibDataError, OSError):
    """Every source of a file failed (network, TLS or HTTP errors, or skipped mirrors).

    Attributes:
        what: the file or archive asked for (relative path or URL).
        failures: one :class:`SourceFailure` per source, in the order tried.
        root: the data root the file was meant for.
    """

    def __init__(self, what: str, failures: Sequence[SourceFailure], root: "Path | str", manual: str):
        self.what = what
        self.failures = tuple(failures)
        self.root = Path(root)
        super().__init__(failure_report(f"could not download {what}: every source failed", failures, root, manual))


def failure_report(headline: str, failures: Sequence[SourceFailure], root: "Path | str", manual: str) -> str:
    """The multi-line text naming each source and its reason, the data root and the manual steps."""
    lines = [headline + ":"]
    lines += [f"  - {failure.line()}" for failure in failures] or ["  - (no source is registered)"]
    lines.append(f"  data root: {root}")
    lines.append(f"  manual steps: {manual}")
    lines.append(f"  a host with a broken TLS certificate can be accepted for files with a pinned sha256: "
                 f"`python -m fedlib data download <dataset> --insecure-tls-if-hash-pinned` "
                 f"(or {ENV_INSECURE_TLS}=1); the bytes are still checked against the pinned hash.")
    return "\n".join(lines)


def checksum_failure(what: str, failures: Sequence[SourceFailure], expected: str, root: "Path | str",
                     manual: str) -> ChecksumError:
    """A :class:`ChecksumError` for a download where some source served bytes with the wrong hash."""
    wrong = [f for f in failures if f.hash_mismatch][-1]
    advice = failure_report("Nothing was written; the downloaded bytes were discarded. Sources tried",
                            failures, root, manual)
    return ChecksumError(what, expected, wrong.actual_sha256 or "", advice=advice)


def host_of(url: str) -> str:
    """``'files.grouplens.org'`` for a URL; ``'local file'`` for ``file://``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        return "local file"
    return parts.netloc or url


def insecure_tls_requested(flag: Optional[bool] = None) -> bool:
    """``flag`` when given, else whether ``FEDLIB_INSECURE_TLS_IF_HASH_PINNED`` is ``1``/``true``/``yes``."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV_INSECURE_TLS, "").strip().lower() in ("1", "true", "yes", "on")


def unverified_tls_context() -> ssl.SSLContext:
    """A client context that accepts any certificate (used only for hash-pinned files)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def is_tls_certificate_error(exc: BaseException) -> bool:
    """True when ``exc`` is (or wraps) a refused server certificate."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    return isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, ssl.SSLCertVerificationError)


def describe_failure(exc: BaseException) -> str:
    """One short line for a failed request: the kind of failure and the library's words."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        detail = getattr(reason, "verify_message", "") or str(reason)
        return f"TLS certificate not accepted ({detail})"
    if isinstance(reason, ssl.SSLError):
        return f"TLS error ({reason})"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "no answer before the timeout"
    if isinstance(reason, socket.gaierror):
        return f"host name not resolved ({reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    return f"{type(reason).__name__}: {reason}"


def _say(message: str) -> None:
    print(f"fedlib: {message}", file=sys.stderr)


def fetch_first_verified(sources: Sequence[Source], dest: Path, fetch: FetchFunction, *,
                         expected: Callable[[Source], Optional[str]], pinned: bool,
                         insecure_tls_if_hash_pinned: bool = False) -> Tuple[Source, str, List[SourceFailure]]:
    """Download from the first source that answers with the right bytes.

    Args:
        sources: canonical sources first, then mirrors.
        dest: file the bytes are written to (truncated on every attempt).
        fetch: see :data:`FetchFunction`.
        expected: the sha256 a source's bytes must have (``None``: not known yet, the
            caller records the digest on first use).
        pinned: whether the expected hash comes from the registry (mirrors and the
            insecure-TLS retry are only allowed then).
        insecure_tls_if_hash_pinned: retry a host whose certificate was refused without
            certificate checks (only when ``pinned``).

    Returns:
        ``(source used, sha256 of its bytes, failures of the sources tried before it)``.

    Raises:
        AllSourcesFailedError: no source delivered acceptable bytes. The caller turns the
            failures into its own error (see :func:`checksum_failure`); ``what`` and
            ``root`` in this exception are placeholders.
    """
    failures: List[SourceFailure] = []

    def fail(source: Source, reason: str, actual: Optional[str] = None) -> None:
        failure = SourceFailure(source, reason, actual)
        failures.append(failure)
        _say(f"download failed: {failure.line()}; trying the next source" if source is not sources[-1]
             else f"download failed: {failure.line()}")

    for source in sources:
        if source.mirror and not pinned:
            fail(source, "skipped: a mirror is only used for files whose sha256 is pinned in the registry")
            continue
        want = expected(source)
        try:
            actual = fetch(source.url, dest, None)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            if not (is_tls_certificate_error(exc) and insecure_tls_if_hash_pinned and pinned and want):
                fail(source, describe_failure(exc))
                continue
            _say("WARNING: " + "!" * 60)
            _say(f"WARNING: {source.host} presented a TLS certificate that was not accepted "
                 f"({describe_failure(exc)}).")
            _say(f"WARNING: --insecure-tls-if-hash-pinned: reading {source.url} WITHOUT certificate checks; "
                 f"the bytes are accepted only if their sha256 is the pinned {want}.")
            _say("WARNING: " + "!" * 60)
            try:
                actual = fetch(source.url, dest, unverified_tls_context())
            except (OSError, urllib.error.URLError, ValueError) as retry_exc:
                fail(source, f"{describe_failure(exc)}; without certificate checks: {describe_failure(retry_exc)}")
                continue
        if want is not None and actual != want:
            fail(source, f"sha256 {actual} differs from the expected {want}; bytes discarded", actual)
            continue
        if failures:
            _say(f"using {source.host} ({'mirror' if source.mirror else 'source'} {source.url}): sha256 verified")
        return source, actual, failures
    raise AllSourcesFailedError("(see failures)", failures, "", "")


__all__ = [
    "ENV_INSECURE_TLS",
    "AllSourcesFailedError",
    "Source",
    "SourceFailure",
    "checksum_failure",
    "describe_failure",
    "failure_report",
    "fetch_first_verified",
    "host_of",
    "insecure_tls_requested",
    "is_tls_certificate_error",
    "unverified_tls_context",
]
