"""Atomic writes: every file or directory objtrain produces appears whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from objtrain.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_free(path: Path, force: bool) -> None:
    """Refuse to overwrite an existing output unless `force`: nothing the user had is lost by accident."""
    if path.exists() and not force:
        raise UserError(f"{path} already exists (pass --force to replace it)")


@contextlib.contextmanager
def atomic_dir(path: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    check_output_free(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; outputs get the user's usual permissions
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        # Move the old output aside first so a crash between the two renames loses nothing.
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary sibling of `path` for writing; fsync and rename it into place on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes 0600
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def write_json(path: Path, obj: Any) -> None:
    with atomic_file(path, "w") as handle:
        json.dump(obj, handle, indent=2, sort_keys=False)
        handle.write("\n")


def read_json(path: Path, what: str = "file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc})") from None
