"""Files a command writes its results to (`--json`, `--output`): checked when the command starts, so a
run of many minutes never ends on an unwritable path, and written whole (temp file + rename), so a
reader or a kill never leaves half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.errors import InfraError


class OutputFileError(InfraError):
    """A result file that cannot be written where an option says (names the option and the value)."""


def checked_output_file(value: str, option: str) -> Path:
    """The path `option` names, if a file can be written there: its directory exists and is a
    writable directory, and the path itself is not a directory. Otherwise `OutputFileError` naming the
    option and the value.

    >>> checked_output_file("/", "--json")
    Traceback (most recent call last):
    ...
    infra.options.output_file.OutputFileError: --json='/': is a directory, expected a file path
    """
    path = Path(value)
    if not value.strip():
        raise OutputFileError(f"{option}={value!r}: expected a file path")
    if path.is_dir():
        raise OutputFileError(f"{option}={value!r}: is a directory, expected a file path")
    parent = path.parent
    if not parent.exists():
        raise OutputFileError(f"{option}={value!r}: directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise OutputFileError(f"{option}={value!r}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputFileError(f"{option}={value!r}: directory {str(parent)!r} is not writable")
    return path


def write_atomic(path: Path, text: str) -> None:
    """`text` to `path` whole: a temp file beside it, fsynced, renamed over it."""
    from clients.files import fsync_dir

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
