"""Where documents come from: files, directories and the standard library, and how a file becomes documents.

Formats, chosen by file name: `*.jsonl` is one JSON object per line with the text in one field; `*.parquet`
is a Parquet file with the text in one column (read a row group at a time); `*.arrow` is an Arrow IPC
stream (a `datasets` `save_to_disk` folder holds these, next to its `state.json`, which gives their order);
anything else is UTF-8 text. JSONL and text may be compressed (`*.gz`, `*.zst`); a compressed file cut short
is a bad file (below), never a shorter corpus. A text file is one document
unless `doc_split` cuts it:
- `blank-line`: a document is a run of non-blank lines, without the line break that ends its last line;
- `line`: every non-blank line is a document, without its line break.
Lines end at `\\n` only, so `\\r\\n` files keep their `\\r` inside documents and decode back exactly.
Text is read a block at a time and a document comes out in fragments (`iter_fragments`), so one that is
a whole file of one line is never held whole; `iter_pieces` cuts them where the encoder cuts a long text.

Bad files: a binary (NUL byte) or non-UTF-8 file met while walking a directory is *skipped and counted*
(real corpus folders hold stray images, archives, Latin-1 leftovers; one should not sink a long run),
while the same file named explicitly on the command line is *refused*: the user asked for it by name.
Bad records: a JSONL line that is not JSON or lacks the text field, or a null in a Parquet/Arrow text
column, is skipped and counted (`BadRecords`) unless the caller asks for strictness (`tokenize --strict`).
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import gzip
import hashlib
import io
import json
import os
import re
import sysconfig
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from objtrain.data.bad_records import BadRecords
from objtrain.errors import UserError

DocSplit = Literal["file", "blank-line", "line"]
DOC_SPLITS: tuple[str, ...] = ("file", "blank-line", "line")
CORPORA: tuple[str, ...] = ("stdlib",)
# The standard library's own test suite is left out of `--corpus stdlib`: it is 60% of the bytes, much of
# it repetitive fixtures, and the rest (734 modules, 12 MB) is the cleaner training corpus
# (/work/shared/data/README.md). Point `tokenize` at the stdlib directory to get everything.
STDLIB_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)
BLOCK = 1 << 20


Format = Literal["text", "jsonl", "parquet", "arrow"]
TABLE_FORMATS = ("parquet", "arrow")  # columnar files: records in a text column, read by pyarrow
Compression = Literal["", "gz", "zst"]
# Files of a `datasets` save_to_disk folder that are its bookkeeping, not text.
DATASETS_FILES = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})


@dataclass(frozen=True)
class Source:
    """One readable input file."""

    path: Path
    format: Format
    compression: Compression
    size: int  # bytes on disk
    sha256: str  # of the bytes on disk
    split: str | None = None  # "train" or "valid" when a DatasetDict folder fixes it; None: by hash

    @property
    def compressed(self) -> bool:
        return bool(self.compression)


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The running interpreter's standard-library `.py` files, without site-packages or test suites."""
    root = stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_EXCLUDED_DIRS and not d.startswith("."))
        files += [Path(dirpath) / name for name in sorted(filenames) if name.endswith(".py")]
    return files


def _matches(patterns: Sequence[str], rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(rel, p) for p in patterns)


def check_input(path: Path, what: str = "input") -> None:
    """A one-line `UserError` for an input that leads nowhere: a symbolic-link loop (where
    `Path.resolve()` raises RuntimeError), a link to nothing, a missing path."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(
                f"{what} {path} is a symbolic-link loop: it never reaches a file or directory"
            ) from None
        if os.path.islink(path):
            raise UserError(
                f"{what} {path} is a symbolic link to {os.readlink(path)}, which does not exist"
            ) from None
        if exc.errno == errno.ENOENT:
            raise UserError(f"{what} not found: {path}") from None
        raise UserError(f"{what} {path}: {exc.strerror}") from None


def _key(path: Path) -> Path:
    """`path.resolve()`, or its absolute spelling where a link loop keeps it from resolving."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13's report of a link loop
        return path.absolute()


@dataclass
class DatasetDictSplits:
    """How a `datasets` DatasetDict folder's own splits map onto the store's (recorded in meta.json)."""

    path: Path
    train: str  # the DatasetDict split read into train
    valid: str | None  # the one read into valid; None: valid is cut from train by hash (--valid-fraction)
    unused: tuple[str, ...]  # the other splits, left out

    def describe(self) -> str:
        """One line for tokenize's summary."""
        kept = f"train -> train, {self.valid} -> valid" if self.valid else "train (valid cut from it by hash)"
        left = f"; left out: {', '.join(self.unused)}" if self.unused else ""
        return f"DatasetDict {self.path}: its own splits kept, {kept}{left}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "train": self.train, "valid": self.valid, "unused": list(self.unused)}


@dataclass
class Found:
    """Every input file in order: `(file, named_explicitly, fixed split or None)`, and the DatasetDict
    folders met (their unused splits are not walked)."""

    files: list[tuple[Path, bool, str | None]]
    dataset_dicts: list[DatasetDictSplits]
    # entries that are not files (a FIFO, a socket, a device), listed as skipped without being opened
    # (opening a FIFO would wait for a writer for ever)
    not_files: list[Skipped] = field(default_factory=list)


def dataset_dict_splits(directory: Path) -> DatasetDictSplits:
    """A DatasetDict folder's split plan: `train` -> train; `validation`, else `test` -> valid.

    Its splits are kept apart, never pooled and re-split by hash: a test split read into train would
    leak into training. Without a `train` split there is nothing to map: one line, naming its splits."""
    try:
        splits = json.loads((directory / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        if not (isinstance(splits, list) and all(isinstance(x, str) for x in splits)):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            f"{directory / 'dataset_dict.json'} is not a datasets DatasetDict index (a JSON object with "
            "a list of split names under 'splits')"
        ) from None
    if "train" not in splits:
        raise UserError(
            f"{directory} is a DatasetDict without a 'train' split (splits: {', '.join(splits) or 'none'}); "
            f"tokenize one split's folder instead, e.g. {directory / splits[0]}"
            if splits
            else f"{directory} is a DatasetDict without splits"
        )
    valid = next((name for name in ("validation", "test") if name in splits), None)
    unused = tuple(name for name in splits if name not in ("train", valid))
    return DatasetDictSplits(directory, "train", valid, unused)


def find_files(
    inputs: Sequence[Path], include: Sequence[str] = (), exclude: Sequence[str] = (), skip: Path | None = None
) -> list[tuple[Path, bool]]:
    """`find_inputs`' files as `(file, named_explicitly)`."""
    return [(path, explicit) for path, explicit, _ in find_inputs(inputs, include, exclude, skip).files]


def find_inputs(
    inputs: Sequence[Path], include: Sequence[str] = (), exclude: Sequence[str] = (), skip: Path | None = None
) -> Found:
    """Expand inputs to files in a deterministic order.

    Directories are walked recursively in sorted order, skipping hidden entries; `include`/`exclude` globs
    match a file's name or its path relative to the directory (`*.txt`, `*/test/*`). Files named
    explicitly are always taken. `skip` (the output directory) is never walked into. Inside a DatasetDict
    folder met while walking (`dataset_dict.json`), a split's files carry the store split it maps to.
    """
    for raw in inputs:
        check_input(Path(raw))
    skip_key = _key(skip) if skip is not None else None
    found = Found([], [])
    seen: set[Path] = set()
    fixed: dict[Path, str] = {}  # a DatasetDict split folder -> the store split its files go to

    def add(path: Path, explicit: bool, split: str | None) -> None:
        key = _key(path)
        if key not in seen:
            seen.add(key)
            found.files.append((path, explicit, split))

    for raw in inputs:
        path = Path(raw)
        if path.is_file():
            add(path, True, None)
        elif path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                here = Path(dirpath)
                dirnames[:] = sorted(
                    d for d in dirnames if not d.startswith(".") and _key(here / d) != skip_key
                )
                split = next((fixed[p] for p in (here, *here.parents) if p in fixed), None)
                names = sorted(filenames)
                if "dataset_dict.json" in names:
                    plan = dataset_dict_splits(here)
                    found.dataset_dicts.append(plan)
                    if plan.valid is not None:  # with only a train split, valid is cut from it by hash
                        fixed[here / plan.train], fixed[here / plan.valid] = "train", "valid"
                    dirnames[:] = [d for d in dirnames if d not in plan.unused]
                if DATASETS_FILES & set(names):
                    names = _datasets_files(here, names)
                for name in names:
                    if name.startswith("."):
                        continue
                    file = here / name
                    rel = file.relative_to(path).as_posix()
                    if include and not _matches(include, rel):
                        continue
                    if exclude and _matches(exclude, rel):
                        continue
                    # a link to nothing (or a link loop) is listed by scan() as unreadable, not ignored
                    if file.is_file() or (file.is_symlink() and not file.exists()):
                        add(file, False, split)
                    elif not file.is_dir():
                        found.not_files.append(Skipped(file, f"not a regular file ({_file_type(file)})"))
        else:
            raise UserError(f"input {path} is neither a file nor a directory")
    return found


def _file_type(path: Path) -> str:
    kinds = {"a FIFO": path.is_fifo, "a socket": path.is_socket, "a device": path.is_char_device}
    return next(
        (name for name, test in kinds.items() if test()), "a device" if path.is_block_device() else "?"
    )


def _datasets_files(directory: Path, names: list[str]) -> list[str]:
    """A `datasets` save_to_disk folder: its `.arrow` data files in the order `state.json` lists them
    (sorted names without one), never its JSON bookkeeping, which is not text to train on."""
    arrow = [n for n in names if n.endswith(".arrow")]
    try:
        listed = [f["filename"] for f in json.loads((directory / "state.json").read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        listed = []
    if listed and sorted(listed) == sorted(arrow):
        arrow = listed
    return [*arrow, *(n for n in names if n not in DATASETS_FILES and not n.endswith(".arrow"))]


def file_format(path: Path) -> tuple[Format, Compression]:
    name = path.name.lower()
    compression: Compression = ""
    for suffix in ("gz", "zst"):
        if name.endswith("." + suffix):
            compression, name = suffix, name[: -len(suffix) - 1]  # type: ignore[assignment]
    if not compression and name.endswith(".parquet"):
        return "parquet", ""
    if not compression and name.endswith(".arrow"):
        return "arrow", ""
    return ("jsonl" if name.endswith(".jsonl") else "text"), compression


def _open_binary(path: Path, compression: Compression) -> BinaryIO:
    if compression == "gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "zst":
        from objtrain.extras import require

        zstandard = require("zstandard", f"reading {path.name}")
        # frames written with --long=31 need a window past zstd's default decoder limit of 2^27
        decoder = zstandard.ZstdDecompressor(max_window_size=2**31)
        return decoder.stream_reader(open(path, "rb"), read_across_frames=True, closefd=True)  # type: ignore[no-any-return]
    return open(path, "rb")


ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE = 0x184D2A50  # to 0x184D2A5F: frames of metadata, no content


def zstd_truncation(path: Path) -> str | None:
    """Where a `.zst` file ends inside a frame, or None when every frame is whole.

    zstandard's streaming reader stops quietly at the end of the input, so a cut file would read as a
    shorter corpus; gzip raises instead. Walking the frame and block headers (RFC 8878) finds the cut
    without decompressing: only the headers are read, the blocks are seeked over.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:

        def need(n: int, what: str, frame: int) -> bytes:
            data = f.read(n)
            if len(data) < n:
                raise _Cut(f"truncated zstd file: it ends inside {what} of frame {frame} (at byte {size})")
            return data

        frame = 0
        try:
            while header := f.read(4):
                frame += 1
                if len(header) < 4:
                    raise _Cut(f"truncated zstd file: it ends inside the header of frame {frame}")
                magic = int.from_bytes(header, "little")
                if magic & 0xFFFFFFF0 == ZSTD_SKIPPABLE:
                    length = int.from_bytes(need(4, "the header", frame), "little")
                    if f.seek(length, os.SEEK_CUR) > size:
                        raise _Cut(f"truncated zstd file: it ends inside frame {frame} (at byte {size})")
                    continue
                if magic != ZSTD_MAGIC:
                    return None  # not zstd here: decompressing says so, with zstandard's own message
                descriptor = need(1, "the header", frame)[0]
                single_segment = descriptor >> 5 & 1
                fcs = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
                need((0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3] + fcs, "the header", frame)
                last = 0
                while not last:
                    block = int.from_bytes(need(3, "a block header", frame), "little")
                    last, kind, length = block & 1, block >> 1 & 3, block >> 3
                    if kind == 3:  # reserved: a damaged file, not a cut one; decompressing says so
                        return None
                    if kind == 1:  # RLE: one byte repeated
                        length = 1
                    if f.seek(length, os.SEEK_CUR) > size:
                        raise _Cut(
                            f"truncated zstd file: it ends inside a block of frame {frame} (at byte {size})"
                        )
                if descriptor >> 2 & 1:
                    need(4, "the checksum", frame)
        except _Cut as cut:
            return str(cut)
    return None


class _Cut(Exception):
    pass


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged compressed file raises: gzip's errors, and zstandard's when it is installed."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def _check_text(stream: BinaryIO) -> str | None:
    """Why a stream is not UTF-8 text without NUL bytes, or None when it is."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    while block := stream.read(BLOCK):
        nul = block.find(b"\x00")
        if nul >= 0:
            return f"binary file (NUL byte at offset {offset + nul})"
        try:
            decoder.decode(block)
        except UnicodeDecodeError as exc:
            return f"not UTF-8 text (invalid byte at offset {offset + exc.start})"
        offset += len(block)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return "not UTF-8 text (truncated character at the end)"
    return None


def scan(path: Path, explicit: bool, text_field: str = "text", split: str | None = None) -> Source | Skipped:
    """Hash a file and check that it is readable: UTF-8 text without NUL bytes (read in blocks), or a
    Parquet/Arrow file with a string column `text_field` (its footer or schema only).

    Raises `UserError` for a bad file named explicitly; returns `Skipped` for one found in a directory.
    """
    fmt, compression = file_format(path)
    digest = hashlib.sha256()
    reason: str | None
    try:
        with open(path, "rb") as raw:
            while block := raw.read(BLOCK):
                digest.update(block)
        size = path.stat().st_size
        if fmt in TABLE_FORMATS:
            from objtrain.data import tables

            reason = tables.check(path, fmt, text_field)
        else:
            with _open_binary(path, compression) as stream:  # first: a missing zstandard is named
                reason = (zstd_truncation(path) if compression == "zst" else None) or _check_text(stream)
    except _read_errors() as exc:
        reason = f"unreadable ({exc.__class__.__name__}: {exc})" if compression else f"unreadable ({exc})"
    if reason is not None:
        if explicit:
            what = "a Parquet or Arrow file with a text column" if fmt in TABLE_FORMATS else "UTF-8 text"
            raise UserError(
                f"{path}: {reason}; objtrain reads {what} (files inside a directory are skipped instead)"
            )
        return Skipped(path, reason)
    return Source(path, fmt, compression, size, digest.hexdigest(), split)


def _text_stream(source: Source) -> io.TextIOWrapper:
    # newline="\n": lines end at \n only and come back untranslated, so \r\n and lone \r survive.
    return io.TextIOWrapper(_open_binary(source.path, source.compression), encoding="utf-8", newline="\n")


# A document as it is read: `(text, end)` fragments whose texts join to the document, `end` True on its
# last one. A text file gives fragments of at most a block or two, so no document is ever held whole.
Fragments = Iterator[tuple[str, bool]]


def iter_documents(
    source: Source, doc_split: DocSplit = "file", text_field: str = "text", bad: BadRecords | None = None
) -> Iterator[str]:
    """Documents of one file, in file order, each whole. Empty documents are yielded too (the caller counts
    them). `iter_pieces` gives the same documents in bounded pieces instead.

    Malformed records (JSONL, Parquet, Arrow) go to `bad`: skipped and counted, or refused when it is
    strict; without `bad` they are refused."""
    held: list[str] = []
    for text, end in iter_fragments(source, doc_split, text_field, bad):
        held.append(text)
        if end:
            yield "".join(held)
            held = []


def iter_pieces(
    source: Source,
    doc_split: DocSplit,
    limit: int,
    text_field: str = "text",
    bad: BadRecords | None = None,
) -> Fragments:
    """`iter_documents`' documents as `(piece, last)`: a document of at most `limit` characters as one
    piece, a longer one in the pieces `pieces(document, limit)` gives, read from the file as they are
    needed: memory follows `limit` and the read block, never the document (a log or minified file of one
    line, gigabytes long)."""
    return repiece(iter_fragments(source, doc_split, text_field, bad), limit)


def iter_fragments(
    source: Source, doc_split: DocSplit = "file", text_field: str = "text", bad: BadRecords | None = None
) -> Fragments:
    """The documents of one file as fragments (`Fragments`), read a block at a time where the format
    allows: text (plain or compressed) streams; a JSONL record or a Parquet/Arrow cell is one value that
    the parser hands over whole, so such a document is one fragment, read whole."""
    bad = bad if bad is not None else BadRecords(strict=True)
    if source.format in TABLE_FORMATS:
        from objtrain.data import tables

        yield from ((text, True) for text in tables.iter_texts(source.path, source.format, text_field, bad))
        return
    with _text_stream(source) as stream:
        if source.format == "jsonl":
            yield from ((text, True) for text in _jsonl_documents(source.path, stream, text_field, bad))
        elif doc_split == "file":
            # the decoder never splits a character: a block ends after a whole code point
            while block := stream.read(BLOCK):
                yield block, False
            yield "", True
        else:
            yield from split_fragments(stream, doc_split, BLOCK)


def split_text(stream: io.TextIOBase, doc_split: DocSplit, block: int = BLOCK) -> Iterator[str]:
    """Non-blank lines (`line`) or paragraphs (`blank-line`) of a text stream opened with newline="\n"."""
    held: list[str] = []
    for text, end in split_fragments(stream, doc_split, block):
        held.append(text)
        if end:
            yield "".join(held)
            held = []


def split_fragments(stream: io.TextIOBase, doc_split: DocSplit, block: int = BLOCK) -> Fragments:
    """`split_text`'s documents as fragments, read `block` characters at a time (never a whole line)."""
    blocks = iter(lambda: stream.read(block), "")
    return _paragraphs(blocks) if doc_split == "blank-line" else _lines(blocks)


def _cr(text: str) -> str:
    """`text` without the \r of a \r\n that ended it."""
    return text[:-1] if text[-1:] == "\r" else text


def _lines(blocks: Iterator[str]) -> Fragments:
    """Every line with a non-whitespace character, without its line break (\n or \r\n).

    A line that goes on past a block is given out as it is read, up to its last non-whitespace character
    (nothing after it can undo that it is a document, and only its last character may be the \r to
    drop); its whitespace tail is kept for the next block. Only a line of nothing but whitespace, not
    yet known to be one, is held whole: a gigabyte of spaces without a line break would be."""
    carry, open_ = "", False  # open_: the line in `carry` has fragments out already
    for block in blocks:
        lines = (carry + block).split("\n")
        carry = lines.pop()  # the line still going on
        if lines and open_:
            yield _cr(lines[0]), True  # the rest of the open line (may be empty)
            open_ = False
            lines[0] = ""
        yield from ((_cr(line), True) for line in lines if line.strip())
        kept = len(carry.rstrip())
        if kept:
            yield carry[:kept], False
            carry, open_ = carry[kept:], True
    if open_ or carry.strip():
        yield _cr(carry), True


# One or more blank (whitespace-only) lines, with the line break before them: what separates paragraphs.
_BLANK_LINES = re.compile(r"\n(?:[^\S\n]*\n)+")
_LEADING_BLANK = re.compile(r"\A(?:[^\S\n]*\n)+")
_TRAILING_BLANK = re.compile(r"(?:\n[^\S\n]*)+\Z")


def _paragraphs(blocks: Iterator[str]) -> Fragments:
    """Runs of non-blank lines, without the line break (\n or \r\n) that ends their last line.

    Separators are found by regex over whole blocks, not line by line: this is the hot path for corpora
    of short documents. A paragraph that goes on past a block is given out as it is read, up to its last
    non-whitespace character (a separator is whitespace, so it can only start after that character);
    the whitespace after it is kept, to be split with the next block. As in `_lines`, only whitespace
    not yet known to open a paragraph is held whole.
    """
    carry, open_ = "", False  # open_: the paragraph in `carry` has fragments out already
    for block in blocks:
        parts = _BLANK_LINES.split(carry + block)
        carry = parts.pop()  # may go on in the next block
        if parts and open_:
            yield _cr(parts[0]), True  # the rest of the open paragraph (may be empty)
            open_ = False
            parts[0] = ""
        elif parts:
            # Only the first part can open with blank lines: at the start of the file, or when a block
            # boundary cut a separator in two.
            parts[0] = _LEADING_BLANK.sub("", parts[0])
        yield from ((_cr(p), True) for p in parts if p.strip())
        if not open_:
            carry = _LEADING_BLANK.sub("", carry)
        kept = len(carry.rstrip())
        if kept:
            yield carry[:kept], False
            carry, open_ = carry[kept:], True
    if open_:
        yield _cr(_TRAILING_BLANK.sub("", carry)), True
        return
    last = _TRAILING_BLANK.sub("", carry)
    if last.strip():
        yield _cr(last), True


def _cut(text: str, start: int, limit: int) -> int:
    """Where the piece of `text` that starts at `start` ends: just before the last space within `limit`
    characters that starts a word, else at `limit`."""
    end = start + limit
    cut = text.rfind(" ", start + 1, end + 1)
    while cut > start and text[cut - 1].isspace():  # inside a run of whitespace: not a word start
        cut = text.rfind(" ", start + 1, cut)
    return cut if cut > start else end


def pieces(text: str, limit: int) -> Iterator[str]:
    """`text` in pieces of at most `limit` characters, each cut just before a space that starts a word
    (where sentencepiece and byte-level BPE pre-tokenizers begin a new piece anyway, so the tokens are
    those of the whole text), else at `limit`. The pieces join back to `text`; each is encoded on its own,
    so a document's memory in flight is a few pieces however long it is (a log or a minified file)."""
    start, n = 0, len(text)
    while n - start > limit:
        cut = _cut(text, start, limit)
        yield text[start:cut]
        start = cut
    yield text[start:]


def repiece(fragments: Iterable[tuple[str, bool]], limit: int) -> Fragments:
    """Documents given as fragments, as `(piece, last)`: the pieces `pieces(document, limit)` gives
    (a document of at most `limit` characters is one piece), found while the fragments come in.

    A cut looks at most `limit + 1` characters ahead of where the piece starts, so only that much (and
    a fragment) is held: the pieces, and so the tokens, are those of the whole document read at once."""
    held: list[str] = []
    size = 0
    for text, end in fragments:
        if end and not held:  # a document in one fragment (a short one, a JSONL value): cut by index
            if len(text) <= limit:
                yield text, True
                continue
            parts = pieces(text, limit)
            part = next(parts)
            for following in parts:
                yield part, False
                part = following
            yield part, True
            continue
        if text:
            held.append(text)
            size += len(text)
        while size > limit:  # more than a piece is known: where the next one ends is decided
            buf = "".join(held)
            cut = _cut(buf, 0, limit)
            yield buf[:cut], False
            held, size = [buf[cut:]], size - cut
        if end:
            yield "".join(held), True
            held, size = [], 0


def _jsonl_documents(path: Path, stream: io.TextIOWrapper, field: str, bad: BadRecords) -> Iterator[str]:
    for lineno, line in enumerate(stream, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.add(where, f"malformed JSON ({exc.msg}, column {exc.colno})")
            continue
        if not isinstance(record, dict) or field not in record:
            bad.add(where, f"no {field!r} field in this record (choose one with --text-field)")
            continue
        text = record[field]
        if not isinstance(text, str):
            bad.add(where, f"field {field!r} is {type(text).__name__}, not a string")
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            bad.add(where, f"field {field!r} holds a lone surrogate escape, not text")
            continue
        yield text
