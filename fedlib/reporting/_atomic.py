"""Write files so that readers only ever see the old content or the complete new content.

Results tables, cache entries and figures are written to a temporary file in the target's
own folder and then renamed over the target. A rename within one file system is atomic on
POSIX and Windows, so a process killed half-way (or a writer that raises) leaves the
previous file untouched and never a truncated one. The temporary file is removed on error.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_writer(path: str | Path, *, binary: bool = False, encoding: str = "utf-8") -> Iterator[IO]:
    """Yield a file handle whose content replaces ``path`` only if the block finishes.

    The parent folder is created when missing. On success the data is flushed and fsync'ed
    before the rename, so a power loss cannot leave an empty file under the final name.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Same folder as the target: os.replace is only atomic within one file system.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp_path = Path(tmp_name)
    try:
        mode = "wb" if binary else "w"
        # newline="" keeps the bytes we write: csv writers and JSON choose their own line ends.
        open_kwargs = {} if binary else {"encoding": encoding, "newline": ""}
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    _fsync_directory(target.parent)


def atomic_write_text(path: str | Path, text: str, *, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text`` atomically and return the path."""
    with atomic_writer(path, encoding=encoding) as handle:
        handle.write(text)
    return Path(path)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically and return the path."""
    with atomic_writer(path, binary=True) as handle:
        handle.write(data)
    return Path(path)


def _fsync_directory(directory: Path) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
