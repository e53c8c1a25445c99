"""Writing a file whole or not at all: the one writer of run results, checkpoints and reports.

The bytes go to a temporary name beside the file, are flushed to the disk, and are renamed over it, so that a
reader, or a process killed mid-write, sees the old file or the new one, never half of it. A write that fails
(a full disk, a read-only folder) is a StorageError naming the file, and leaves nothing half-written behind.
A command checks the folder its output goes to with `writable_folder` before its work, not after.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


class StorageError(Exception):
    """A file that could not be written; the message names the path, the reason and what to do."""

    def __init__(self, path: Path, exc: OSError) -> None:
        self.path, self.errno = path, exc.errno
        code = errno.errorcode.get(exc.errno or 0, "")
        self.reason = f"{exc.strerror or exc}{f' ({code})' if code else ''}"
        super().__init__(f"cannot write {path}: {self.reason}; {self.fix()}")

    def fix(self, elsewhere: str = "") -> str:
        """What to do about it; `elsewhere` (such as '--runs DIR') names the option that writes somewhere else."""
        if self.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free some space" + (f" or pass {elsewhere} on another disk" if elsewhere else "")
        if self.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return "make the folder writable" + (f" or pass {elsewhere} on a writable disk" if elsewhere else "")
        return "check the folder"

    def advice(self, elsewhere: str, then: str) -> str:
        """The message for a command with an option `elsewhere` that writes somewhere else, and what to do `then`."""
        return f"cannot write {self.path}: {self.reason}; {self.fix(elsewhere)}, then {then}"


def temporary(path: Path) -> Path:
    """A temporary name beside path, private to this process (two writers never share one)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def put_bytes(path: Path, data: bytes) -> None:
    """data to path, flushed to the disk (an OSError on failure)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace(source: Path, target: Path) -> None:
    """Rename source over target; a StorageError naming target on failure."""
    try:
        os.replace(source, target)
    except OSError as exc:
        raise StorageError(target, exc) from None


def write_file(path: Path, data: bytes, target: Path | None = None) -> None:
    """put_bytes, with a failure a StorageError naming `target` (the file a temporary path stands for; else path)
    and nothing half-written left behind."""
    try:
        put_bytes(path, data)
    except OSError as exc:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
        raise StorageError(target or path, exc) from None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write data (text as UTF-8) to a temporary file beside path, then rename it over path."""
    tmp = temporary(path)
    write_file(tmp, data.encode() if isinstance(data, str) else data, path)
    replace(tmp, path)


def shown_path(path: Path) -> str:
    """A path relative to the working directory when it lies inside it, so that committed reports carry no machine's
    paths."""
    path, here = path.resolve(), Path.cwd().resolve()
    return path.relative_to(here).as_posix() if path.is_relative_to(here) else str(path)


def writable_folder(folder: Path, flag: str = "--out") -> Path:
    """folder, when it is or can be made a writable folder (nothing is made yet); else a one-line ValueError naming the
    flag, so that a command checks where its report goes before its work, not after."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=existing):  # a real write: permissions alone miss read-only mounts and /proc
            pass
    except OSError:
        raise ValueError(
            f"{flag} {folder}: cannot write there ({existing} is not a writable folder); give one you can write"
        ) from None
    return folder
