"""Atomic writes: every file or directory objtrain produces appears whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from objtrain.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# What a write that cannot happen raises: a read-only mount, no permission, an immutable file, a full disk
# or quota. Each becomes one line (`unwritable`), never a traceback; any other OSError is a bug and keeps it.
WRITE_ERRNOS = frozenset(
    {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ETXTBSY}
)


# numpy's `tofile` reports a write the disk cut short without an errno: "600000 requested and 28672 written".
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def is_unwritable(exc: BaseException) -> bool:
    if not isinstance(exc, OSError):
        return False
    return exc.errno in WRITE_ERRNOS or (exc.errno is None and bool(_SHORT_WRITE.search(str(exc))))


def _reason(exc: OSError) -> str:
    if exc.errno is None and _SHORT_WRITE.search(str(exc)):
        return "No space left on device (a write was cut short)"
    return exc.strerror or str(exc)


class Unwritable(UserError):
    """An output that could not be written (`WRITE_ERRNOS`); `reason` is the system's words for it."""

    def __init__(self, output: Path | str, reason: str, kept: str = "") -> None:
        self.output, self.reason, self.kept = str(output), reason, kept
        super().__init__(f"cannot write {output}: {reason}" + (f" ({kept})" if kept else ""))


def unwritable(exc: OSError, output: Path | str, kept: str = "") -> Unwritable:
    """The one line for a write that failed: which output, why, and (`kept`) what is left of it."""
    return Unwritable(output, _reason(exc), kept)


def check_no_link_loop(path: Path, what: str = "output") -> None:
    """Refuse a path that goes through a loop of symbolic links (`a -> b -> a`), in one line: every later
    step would fail on it with its own traceback (`resolve()`'s RuntimeError, `mkdir`'s FileExistsError)."""
    try:
        Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # Python < 3.13 raises RuntimeError, later ones ELOOP
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise
        raise UserError(
            f"{what} {path} goes through a loop of symbolic links (a link that leads back to itself): "
            "remove the link or choose another path"
        ) from None


def check_writable(path: Path) -> None:
    """Refuse, before any work, an output that cannot be written: `path` itself if it exists, else the
    nearest existing directory above it, must take a new file (a read-only mount, missing permission or an
    immutable directory fail here, and a disk already full). A loop of symbolic links is refused too."""
    check_no_link_loop(path)
    path = Path(path).absolute()
    probe_dir = path
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        return  # a file in the way: the command's own checks name that
    probe = _temp_name(probe_dir, f".objtrain-probe-{os.getpid()}-", "")
    try:
        try:
            fd = _create_file(probe)
            try:
                os.write(fd, b"\0")
            finally:
                os.close(fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(probe)
    except OSError as exc:
        if not is_unwritable(exc):
            raise
        where = "" if probe_dir == path else f" (in {probe_dir})"
        raise Unwritable(path, f"{_reason(exc)}{where}", "nothing was written") from None


# Libraries written in Rust (safetensors, tokenizers) report a failed write in their own exception types,
# with the errno only in the text: "I/O error: No space left on device (os error 28)".
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(exc: BaseException, path: Path | str) -> OSError | None:
    """`exc` as the OSError it stands for: itself, or a Rust library's error that names an errno in its
    text (so a full disk is the same one line whichever library wrote the file); None for anything else."""
    if isinstance(exc, OSError):
        return exc
    if not isinstance(exc, Exception):
        return None
    code = _OS_ERROR.search(str(exc))
    if code is None:
        return None
    number = int(code.group(1))
    return OSError(number, os.strerror(number), str(path))


def save_tensors(tensors: dict[str, Any], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' `save_file`, leaving the file with the user's usual permissions like every other output
    (it writes 0600 files: a checkpoint shared with a group would be readable but for its weights)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as exc:
        failed = os_error_of(exc, path)
        if failed is None:
            raise
        raise failed from exc
    os.chmod(path, 0o666 & ~_umask())


def check_output_free(
    path: Path, force: bool, inputs: Iterable[Path] = (), replaces: tuple[str, tuple[str, ...]] | None = None
) -> None:
    """Refuse to overwrite an existing output unless `force`, and refuse outright an output that would
    replace the current directory, one of its parents, or an input (or a directory holding one):
    nothing the user had is lost by accident.

    `replaces` = (what, markers): `--force` replaces only an empty directory, a link, or a directory
    holding one of the marker files, i.e. an earlier output of the same command, never a folder of the
    user's that happens to have the name."""
    path = Path(path)
    check_writable(path)
    target = path.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        what = "the current directory" if target == cwd else "a parent of the current directory"
        raise UserError(f"output {path} is {what}: name a new directory, e.g. -o runs/out")
    for source in inputs:
        source = Path(source).resolve()
        if target == source or target in source.parents:
            raise UserError(f"output {path} would replace the input {source}: name a new directory")
    check_unclaimed(path)
    if path.exists() and not force:
        raise UserError(f"{path} already exists (pass --force to replace it)")
    if path.exists() and replaces is not None and not path.is_symlink():
        what, markers = replaces
        ours = path.is_dir() and (not any(path.iterdir()) or any((path / m).exists() for m in markers))
        if not ours:
            raise UserError(f"{path} exists and is not {what}: --force replaces only that; choose another -o")


# Temporaries are named `.NAME.PID-RANDOM.tmp` beside NAME: a later run into the same output recognises
# those of a process that no longer runs (killed with SIGKILL, power loss) and removes them.
def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}-"


def _temp_name(parent: Path, prefix: str, suffix: str) -> Path:
    """A fresh name for a temporary, not yet created. Callers hold the name before they create the file
    (unlike `tempfile.mkstemp`/`mkdtemp`, which return it only after): a Ctrl-C that lands right after the
    creation, before the name would have reached the caller, must still find the temporary to remove."""
    while True:
        name = Path(parent) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        if not (name.exists() or name.is_symlink()):
            return name


def _create_file(name: Path) -> int:
    """Create `name` for writing, failing if it exists (`O_EXCL`: never someone else's file), with the
    user's usual permissions (0666 less the umask; mkstemp would make 0600)."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove(path: Path) -> None:
    """Delete a file, link or directory tree; gone already is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_stale(path: Path) -> list[Path]:
    """Remove what an interrupted earlier write of `path` left beside it, and return what was removed.

    A dead process's temporaries go. `.NAME.old` is the previous output moved aside by a replace that was
    cut between its two renames: if NAME is missing, it is put back (nothing the user had is lost);
    if NAME is there, the replace finished and the old copy goes.
    """
    path = Path(path)
    parent = path.parent
    if not path.name or not parent.is_dir() or _claim_holder(path) is not None:
        return []  # another process writing there owns what lies beside it (its `.old` mid-replace)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)-[A-Za-z0-9_]+\.tmp$")
    removed = []
    for entry in parent.iterdir():
        match = pattern.match(entry.name)
        if match and not _pid_alive(int(match.group(1))):
            _remove(entry)
            removed.append(entry)
    old = parent / f".{path.name}.old"
    if old.exists() or old.is_symlink():
        if path.exists() or path.is_symlink():
            _remove(old)
            removed.append(old)
        else:
            os.replace(old, path)
    return removed


# The outputs this process has put in place whole (`atomic_dir`), newest last: a Ctrl-C after one of them
# says it is complete rather than "nothing was written".
_completed: list[Path] = []


def completed_outputs() -> list[Path]:
    return list(_completed)


def forget_completed() -> None:
    """A new command starts with none (tests run several in one process)."""
    _completed.clear()


# An output being written is claimed by its writer: an exclusive `flock` on `.NAME.lock` beside it, taken
# before the work and held until the finished output is renamed into place (`atomic_dir`). A second writer
# is refused in one line, before its work (`check_output_free`) or at the latest when it would start
# writing, so no finished output is ever replaced by a run that was not asked to replace it.
def _claim_file(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


_held: set[Path] = set()  # the claim files this process holds


def _claim_holder(path: Path) -> str | None:
    """Who holds the claim on output `path` if another process does ("" when it cannot be read), else None."""
    claim = _claim_file(Path(path))
    if claim.absolute() in _held:
        return None
    try:
        fd = os.open(claim, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no claim file (or none readable): nobody is writing there
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return None


def check_unclaimed(path: Path) -> None:
    """Refuse an output that another process is writing (holds its claim), without claiming it."""
    holder = _claim_holder(path)
    if holder is not None:
        by = f" (pid {holder})" if holder.isdigit() else ""
        raise UserError(
            f"{path} is in use by another objtrain process{by}: wait for it to end, or choose another output"
        )


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[None]:
    """Hold the claim on output `path` (its parent must exist) for the block; the claim file goes after."""
    path = Path(path)
    lock = OutputLock(path, "output", file=_claim_file(path), remove=True).acquire()
    _held.add(lock.file.absolute())
    try:
        yield
    finally:
        _held.discard(lock.file.absolute())
        lock.release()


@contextlib.contextmanager
def atomic_dir(path: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path`, on failure it is removed.

    The output is claimed for the whole block (`claimed`) and checked again under the claim, both at the
    start and at the rename: without `force`, an output that appeared meanwhile is never replaced."""
    path = Path(path)
    clean_stale(path)
    check_output_free(path, force)
    kept = "the previous one is kept" if path.exists() else "nothing was written"
    tmp: Path | None = None
    old = path.with_name(f".{path.name}.old")
    moved = renaming = False
    claim = contextlib.ExitStack()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        claim.enter_context(claimed(path))
        check_output_free(path, force)  # again, now that no other writer can start or finish
        # Named before it is made, so a Ctrl-C at any point after the mkdir removes it (below).
        tmp = _temp_name(path.parent, _temp_prefix(path), ".tmp")
        os.mkdir(tmp)  # 0777 less the umask: the user's usual permissions (mkdtemp would make 0700)
        yield tmp
        if not force and (path.exists() or path.is_symlink()):  # made by a writer that took no claim
            raise UserError(f"{path} already exists (pass --force to replace it)")
        renaming = True  # from here, a missing `tmp` means it was renamed into place
        if path.exists() or path.is_symlink():
            # Move the old output aside first so a crash between the two renames loses nothing
            # (clean_stale puts it back). The old output may be a file or a link: --force replaces only it.
            _remove(old)
            moved = True  # before the rename: a Ctrl-C right after it still puts the old output back
            os.replace(path, old)
            os.replace(tmp, path)
            moved = False
            _remove(old)
        else:
            os.replace(tmp, path)
        _completed.append(path)
    except BaseException as exc:
        if renaming and tmp is not None and not tmp.exists() and path.exists():
            _completed.append(path)  # cut (Ctrl-C) right after the rename: the output is whole all the same
        if moved and not (path.exists() or path.is_symlink()):
            with contextlib.suppress(OSError):
                os.replace(old, path)  # the previous output back where it was
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        failed = os_error_of(exc, path)
        if failed is not None and is_unwritable(failed):  # a full disk: one line, nothing half-written
            raise unwritable(failed, path, kept) from None
        raise
    finally:
        claim.close()


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary sibling of `path` for writing; fsync and rename it into place on success."""
    path = Path(path)
    kept = "the previous one is kept" if path.exists() else "nothing was written"
    tmp_name: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(path)
        tmp_name = _temp_name(path.parent, _temp_prefix(path), ".tmp")  # named first, as in atomic_dir
        fd = _create_file(tmp_name)
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        if tmp_name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
        failed = os_error_of(exc, path)
        if failed is not None and is_unwritable(failed):
            raise unwritable(failed, path, kept) from None
        raise


def _valid_text(obj: Any) -> Any:
    """`obj` with every string made valid Unicode: a file name that is not UTF-8 reaches Python with lone
    surrogates (`\\udcff`), which no other JSON reader accepts; its bytes are written as `\\xff` instead."""
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(obj, dict):
        return {_valid_text(k): _valid_text(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_valid_text(v) for v in obj]
    return obj


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2, sort_keys=False)
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates somewhere
        text = json.dumps(_valid_text(obj), indent=2, sort_keys=False)
    with atomic_file(path, "w") as handle:
        handle.write(text + "\n")


def read_json(path: Path, what: str = "file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc})") from None


def is_count(value: Any, least: int = 0) -> bool:
    """An int (not a bool) of at least `least`: what a count read back from JSON must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


class OutputLock:
    """An output directory held by one process while it writes there: an exclusive `flock` on `DIR/.lock`.

    A second command into the same directory is refused in one line instead of interleaving its files with
    the first's. The kernel drops the lock when its holder ends, however it ends (SIGKILL, power loss), so
    a stale lock of a dead process is simply taken over; the file itself stays, naming the last holder."""

    NAME = ".lock"

    def __init__(
        self, directory: Path, what: str = "directory", file: Path | None = None, remove: bool = False
    ) -> None:
        """`file`: the lock file (default DIR/.lock); `remove`: delete it on release, while still held (a
        process that opened it meanwhile sees it gone once it gets the lock, and opens the new one)."""
        self.directory = Path(directory)
        self.what = what
        self.file = Path(file) if file is not None else self.directory / self.NAME
        self.remove = remove
        self.fd: int | None = None

    def acquire(self) -> OutputLock:
        if self.fd is not None:
            return self
        path = self.file
        try:
            while True:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~_umask())
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                    os.close(fd)
                    by = f" (pid {holder})" if holder.isdigit() else ""
                    raise UserError(
                        f"{self.directory} is in use by another objtrain process{by}: wait for it to "
                        f"end, or choose another {self.what}"
                    ) from None
                try:  # the file may have been replaced between the open and the lock: lock the one there
                    same = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            if is_unwritable(exc):
                raise unwritable(exc, self.directory, "nothing was written") from None
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            if self.remove:
                with contextlib.suppress(OSError):
                    os.unlink(self.file)
            os.close(self.fd)  # closing the last descriptor drops the lock
            self.fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
