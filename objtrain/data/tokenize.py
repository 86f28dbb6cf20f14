"""Text -> token store: find documents, train (or reuse) a tokenizer, encode everything, streaming.

Three passes over the inputs, none of which holds the corpus in memory:
1. scan: hash every file, check it is UTF-8 text (bad files inside directories are skipped, see sources.py);
2. sample (only when training a tokenizer): keep the training documents with the smallest sample keys up to
   `train_bytes`, a bottom-k sample that does not depend on file order, and train sentencepiece on it;
3. encode: read documents in chunks of about `chunk_bytes`, encode chunks on all cores (sentencepiece
   releases the GIL) while more are read, append their tokens to `<split>.bin` in order.

A document longer than `PIECE_CHARS` is read and encoded in pieces (`sources.iter_pieces`), never whole:
its split is known only at its end (the keyed hash of all its bytes), so the tokens of its earlier pieces
wait in a temporary file until then (`_Spool`).

Train/valid split: each document's split comes from a keyed hash of its bytes and the seed, so it does not
depend on order or on which other files are present, and identical documents always land together (no
copy of a training document leaks into validation).
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import itertools
import os
import platform
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from objtrain.data import sources as src
from objtrain.data.foreign_tokenizer import tokenizer_from_file
from objtrain.data.sources import DocSplit, Skipped, Source
from objtrain.data.store import (
    META_FILE,
    SPLITS,
    TOKEN_STORE_VERSION,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    TokenStore,
    token_dtype,
)
from objtrain.data.tokenizer import (
    ModelType,
    Tokenizer,
    fixed_special_names,
    train_sentencepiece,
)
from objtrain.errors import UserError, did_you_mean
from objtrain.io import atomic_dir, check_output_free, read_json, write_json
from objtrain.specials import DEFAULT_SENTINELS, N_FIXED, Specials

MODEL_TYPES: tuple[str, ...] = ("unigram", "bpe", "char")


@dataclass
class TokenizeConfig:
    """Options of `objtrain tokenize` (see its --help for each)."""

    corpus: str | None = None  # a built-in corpus ("stdlib") in addition to the inputs
    include: tuple[str, ...] = ()  # globs for files inside directories; empty = every file
    exclude: tuple[str, ...] = ()
    text_field: str = "text"  # JSONL field or Parquet/Arrow column holding the text
    strict: bool = False  # refuse a malformed record instead of skipping and counting it
    doc_split: DocSplit = "file"  # how a text file becomes documents
    model_type: ModelType = "unigram"
    vocab_size: int = 8192
    tokenizer: Path | None = None  # reuse: a token store directory or a .model file
    n_sentinels: int = 256
    byte_fallback: bool = True  # False: characters outside the vocabulary become <unk>
    train_bytes: int = 3_000_000  # cap on the tokenizer's training sample (2 MB train ~12 s, 4 MB ~30 s)
    valid_fraction: float = 0.05
    seed: int = 0
    num_threads: int = 0  # 0 = every core this process may use
    chunk_bytes: int = 1 << 18  # text per encode call; at most 2 * num_threads chunks in flight


@dataclass
class SplitCounts:
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    unknown: int = 0  # <unk> tokens: characters a tokenizer without byte fallback has no piece for


@dataclass
class TokenizeSummary:
    path: Path
    splits: dict[str, SplitCounts]
    n_sources: int
    skipped: list[Skipped]
    empty_documents: int
    bad_records: src.BadRecords
    vocab_size: int
    tokenizer_trained: bool
    train_seconds: float
    seconds: float
    tokenizer_note: str = ""  # how another model's tokenizer was fitted with objtrain's special tokens
    dataset_dicts: list[src.DatasetDictSplits] = field(default_factory=list)  # whose own splits were kept

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.splits.values())

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.splits.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.splits.values())

    @property
    def unknown(self) -> int:
        return sum(s.unknown for s in self.splits.values())

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / max(self.tokens, 1)


class Progress:
    """What `tokenize_corpus` reports while it runs; the CLI draws it as a progress bar."""

    def start(self, phase: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _hasher(seed: int) -> Any:
    return hashlib.blake2b(digest_size=16, key=seed.to_bytes(8, "little", signed=True))


def _keys(data: bytes, seed: int) -> tuple[float, int]:
    """(split key in [0, 1), sample key): one keyed hash of the document's bytes and the seed."""
    hasher = _hasher(seed)
    hasher.update(data)
    return _digest_keys(hasher)


def _digest_keys(hasher: Any) -> tuple[float, int]:
    """`_keys` of the bytes fed to `hasher` (`_hasher(seed)`), which a long document is fed in pieces."""
    digest = hasher.digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64, int.from_bytes(digest[8:], "little")


def _check_config(config: TokenizeConfig, inputs: Sequence[Path]) -> None:
    if not inputs and config.corpus is None:
        raise UserError("nothing to tokenize: give input files or directories, or --corpus stdlib")
    if config.corpus is not None and config.corpus not in src.CORPORA:
        hint = did_you_mean(config.corpus, src.CORPORA)
        raise UserError(f"unknown --corpus {config.corpus!r}{hint} (choose from: {', '.join(src.CORPORA)})")
    if config.doc_split not in src.DOC_SPLITS:
        raise UserError(
            f"unknown --doc-split {config.doc_split!r}{did_you_mean(config.doc_split, src.DOC_SPLITS)} "
            f"(choose from: {', '.join(src.DOC_SPLITS)})"
        )
    if config.model_type not in MODEL_TYPES:
        hint = did_you_mean(config.model_type, MODEL_TYPES)
        raise UserError(
            f"unknown --model-type {config.model_type!r}{hint} (choose from: {', '.join(MODEL_TYPES)})"
        )
    if config.num_threads < 0:
        raise UserError(f"--threads must be >= 0 (0 = every core), got {config.num_threads}")
    if not 0.0 <= config.valid_fraction < 1.0:
        raise UserError(f"--valid-fraction must be in [0, 1), got {config.valid_fraction}")
    if config.n_sentinels < 0:
        raise UserError(f"--sentinels must be >= 0, got {config.n_sentinels}")
    if config.train_bytes <= 0:
        raise UserError(f"--train-bytes must be positive, got {config.train_bytes}")


def collect_sources(
    inputs: Sequence[Path],
    config: TokenizeConfig,
    progress: Progress,
    output: Path | None = None,
    dataset_dicts: list[src.DatasetDictSplits] | None = None,
) -> tuple[list[Source], list[Skipped]]:
    """Every input file, scanned: readable ones in order, and the ones skipped with the reason. The
    DatasetDict folders met are appended to `dataset_dicts`."""
    found = src.find_inputs(inputs, config.include, config.exclude, skip=output)
    files = found.files
    if config.corpus == "stdlib":
        files += [(path, False, None) for path in src.stdlib_files()]
    if dataset_dicts is not None:
        dataset_dicts += found.dataset_dicts
    progress.start("scanning", len(files))
    sources: list[Source] = []
    skipped: list[Skipped] = list(found.not_files)
    for path, explicit, split in files:
        result = src.scan(path, explicit, config.text_field, split)
        (sources if isinstance(result, Source) else skipped).append(result)  # type: ignore[arg-type]
        progress.advance(1)
    if not sources:
        why = f" ({len(skipped)} skipped: {skipped[0].reason}, ...)" if skipped else ""
        raise UserError(f"empty corpus: no readable text files among the inputs{why}")
    return sources, skipped


def _in_valid(source: Source, data: bytes, config: TokenizeConfig) -> bool:
    """A document's split: its DatasetDict's when it comes from one that has a valid split, else by a
    keyed hash of its bytes (so the same document always lands in the same split)."""
    if source.split is not None:
        return source.split == "valid"
    return _keys(data, config.seed)[0] < config.valid_fraction


def _split_known(source: Source, config: TokenizeConfig) -> bool | None:
    """Whether every document of `source` is a valid one, when that is known before reading it."""
    if source.split is not None:
        return source.split == "valid"
    return False if config.valid_fraction <= 0 else None


# A document longer than this many characters is read and encoded in pieces of at most this size
# (`sources.pieces`). Fixed, not `chunk_bytes`: a store does not depend on how it was chunked, and
# documents below it are never cut.
PIECE_CHARS = 1 << 20


def _pieces(
    sources: Sequence[Source], config: TokenizeConfig, bad: src.BadRecords | None = None
) -> Iterator[tuple[int, str, bool]]:
    """(source index, piece, last piece of its document) of every document, empty ones included (one
    empty piece); malformed records are counted in `bad` (a throwaway counter when None: the sampling
    pass reads them too)."""
    bad = bad if bad is not None else src.BadRecords(config.strict)
    for index, source in enumerate(sources):
        for piece, last in src.iter_pieces(source, config.doc_split, PIECE_CHARS, config.text_field, bad):
            yield index, piece, last


@dataclass
class _Long:
    """A document in several pieces, being read: its bytes so far (hashed, counted); its split once known."""

    hasher: Any
    n_bytes: int = 0
    valid: bool | None = None  # None: not known until its last piece is read


def sample_for_training(sources: Sequence[Source], config: TokenizeConfig, progress: Progress) -> list[str]:
    """Training documents with the smallest sample keys, at most `train_bytes` in all (sorted by key)."""
    progress.start("sampling", sum(s.size for s in sources))
    heap: list[tuple[int, int, str]] = []  # max-heap on the key, through negation
    total = n_train = n_valid = 0
    unreported = 0
    long: _Long | None = None  # the document in several pieces being read
    kept: list[str] = []  # its first pieces, while they hold fewer than train_bytes bytes
    for index, piece, last in _pieces(sources, config):
        data = piece.encode("utf-8")
        unreported += len(data)
        if unreported >= config.chunk_bytes:  # progress in document bytes, a step per chunk
            progress.advance(unreported)
            unreported = 0
        if long is not None or not last:  # a piece of a long document
            if long is None:
                long, kept = _Long(_hasher(config.seed)), []
            long.hasher.update(data)
            # A document larger than the sample is kept in it only alone (the heap below evicts down
            # to one), and then only its first train_bytes, at a piece boundary: never held whole.
            if long.n_bytes < config.train_bytes:
                kept.append(piece)
            long.n_bytes += len(data)
            if not last:
                continue
            split_key, sample_key = _digest_keys(long.hasher)
            source = sources[index]
            valid = source.split == "valid" if source.split is not None else split_key < config.valid_fraction
            n_bytes, text = long.n_bytes, "".join(kept)
            long, kept = None, []
        else:
            if not data:
                continue
            sample_key = _keys(data, config.seed)[1]
            valid = _in_valid(sources[index], data, config)
            n_bytes, text = len(data), piece
        del data
        if valid:
            n_valid += 1
            continue
        n_train += 1
        heapq.heappush(heap, (-sample_key, n_bytes, text))
        total += n_bytes
        while total > config.train_bytes and len(heap) > 1:
            total -= heapq.heappop(heap)[1]
    if n_train == 0:
        if n_valid:
            raise UserError(
                f"all {n_valid} documents fell in the valid split: lower --valid-fraction, or cut files into "
                "more documents with --doc-split blank-line|line"
            )
        raise UserError("empty corpus: the inputs hold no text")
    return [text for _, _, text in sorted(heap, reverse=True)]


def _count_sentinels(model: bytes) -> int:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    n = 0
    while N_FIXED + n < sp.get_piece_size() and sp.id_to_piece(N_FIXED + n).startswith("<extra_id_"):
        n += 1
    return n


def is_hf_tokenizer(path: Path) -> bool:
    """`--tokenizer` names a Hugging Face tokenizer (a .json file, or a directory of one that is not an
    objtrain store or checkpoint, nor an export that keeps objtrain's tokenizer.model)."""
    path = Path(path)
    if path.is_dir() and any((path / name).is_file() for name in (META_FILE, TOKENIZER_FILE)):
        return False
    if path.is_dir() and _checkpoint_tokenizer(path) is not None:
        return False
    return path.name.endswith(".json") or (path / "tokenizer.json").is_file()


def _checkpoint_tokenizer(path: Path) -> tuple[Path, Specials] | None:
    """An objtrain checkpoint's tokenizer file and special-token table, if `path` is a checkpoint."""
    try:
        config = read_json(path / "config.json") if (path / "config.json").is_file() else None
    except UserError:
        return None
    if not isinstance(config, dict) or "model" not in config or not isinstance(config.get("tokenizer"), dict):
        return None
    name = config["tokenizer"].get("file")
    if name not in TOKENIZER_FILES or not isinstance(config.get("specials"), dict):
        return None
    return path / name, Specials.from_dict(config["specials"])


def load_tokenizer(path: Path, n_sentinels: int = DEFAULT_SENTINELS) -> tuple[Tokenizer, str]:
    """A tokenizer to reuse and its model type: from a token store (its meta.json fixes the specials), a
    checkpoint, a bare .model file (the sentinel count is read from its pieces), or a Hugging Face
    tokenizer.json (or a directory holding one): objtrain's special tokens are then found in it or added
    after its vocabulary, `n_sentinels` sentinels among them (`objtrain.data.foreign_tokenizer`)."""
    path = Path(path)
    checkpoint = _checkpoint_tokenizer(path) if path.is_dir() else None
    if checkpoint is not None and not (path / META_FILE).is_file():
        file, specials = checkpoint
        return tokenizer_from_file(file, specials), "unknown"
    if path.is_dir() and not (path / META_FILE).is_file() and (path / TOKENIZER_FILE).is_file():
        path = path / TOKENIZER_FILE  # a checkpoint, or a Hugging Face export that keeps tokenizer.model
    if is_hf_tokenizer(path):
        from objtrain.data.foreign_tokenizer import HFTokenizer, find_tokenizer_json

        file = find_tokenizer_json(path)
        if file is None:
            raise UserError(f"--tokenizer not found: {path}")
        tokenizer = HFTokenizer.plan(file, n_sentinels)
        return tokenizer, f"huggingface {tokenizer.model_type}"
    if path.is_dir():
        store = TokenStore.open(path)
        return store.tokenizer, store.meta["tokenizer"]["model_type"]
    if not path.is_file():
        raise UserError(f"--tokenizer not found: {path}")
    model = path.read_bytes()
    try:
        n_sentinels = _count_sentinels(model)
    except RuntimeError:
        raise UserError(f"{path} is not a sentencepiece model nor a Hugging Face tokenizer.json") from None
    try:
        return Tokenizer(model, Specials(n_sentinels=n_sentinels)), "unknown"
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None


class _SplitWriter:
    """Appends documents to `<split>.bin` and their end offsets to `<split>.idx`."""

    def __init__(self, directory: Path, name: str, dtype: np.dtype, unk: int) -> None:
        self.dtype = dtype
        self.unk = unk
        self.tokens: BinaryIO = open(directory / f"{name}.bin", "wb")  # noqa: SIM115 - closed in close()
        self.index: BinaryIO = open(directory / f"{name}.idx", "wb")  # noqa: SIM115
        np.zeros(1, dtype="<i8").tofile(self.index)
        self.counts = SplitCounts()

    def append(self, tokens: np.ndarray, lengths: np.ndarray, n_bytes: int, ends: np.ndarray) -> None:
        """tokens (sum(lengths),) of len(lengths) texts back to back; `ends` (len(lengths),) marks the texts
        that end a document (a long document comes as several pieces, in order)."""
        if not len(lengths):
            return
        tokens.astype(self.dtype, copy=False).tofile(self.tokens)
        offsets = self.counts.tokens + np.cumsum(lengths, dtype=np.int64)
        offsets[ends].astype("<i8").tofile(self.index)
        self.counts.documents += int(ends.sum())
        self.counts.tokens += int(tokens.size)
        self.counts.bytes += n_bytes
        self.counts.unknown += int(np.count_nonzero(tokens == self.unk))

    def abort(self) -> None:
        """Close without syncing: the caller is about to throw the files away."""
        self.tokens.close()
        self.index.close()

    def close(self) -> None:
        for handle in (self.tokens, self.index):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()

    def append_spool(self, spool: _Spool) -> None:
        """The tokens a spool holds (pieces of one document, none of which ends it), then empties it."""
        assert spool.file is not None
        spool.file.seek(0)
        while block := spool.file.read(1 << 24):
            self.tokens.write(block)
        self.counts.tokens += spool.n_tokens
        self.counts.unknown += spool.unknown
        spool.clear()


class _Spool:
    """The tokens of a long document's first pieces, on disk until its last piece says its split.

    Only one document is ever undecided (documents are read in order), so one spool serves them all."""

    def __init__(self, directory: Path, unk: int) -> None:
        self.directory = directory
        self.unk = unk
        self.file: IO[bytes] | None = None
        self.document: _Long | None = None
        self.n_tokens = self.unknown = 0

    def append(self, document: _Long, tokens: np.ndarray) -> None:
        if self.file is None:  # anonymous: gone when closed, even when the run is killed
            self.file = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 - closed in close()
        self.document = document
        tokens.tofile(self.file)
        self.n_tokens += int(tokens.size)
        self.unknown += int(np.count_nonzero(tokens == self.unk))

    def clear(self) -> None:
        assert self.file is not None
        self.file.seek(0)
        self.file.truncate()
        self.document, self.n_tokens, self.unknown = None, 0, 0

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@dataclass
class _Chunk:
    """Texts to encode in one call: whole documents, or pieces of one longer than a piece (`ends` is True
    for the text that ends its document). A piece of a long document has its `_Long` for `valid`: its
    split may be known only once its last piece is read, after this chunk is encoded."""

    texts: list[str] = field(default_factory=list)
    valid: list[bool | _Long] = field(default_factory=list)
    n_bytes: list[int] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)
    size: int = 0


def _encode_chunk(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of `texts` back to back (n_tokens,) and their lengths (n_texts,), on one encoder thread.

    Converting to numpy here drops the Python int lists (~36 bytes a token) as soon as possible."""
    ids = tokenizer.encode_batch(texts, num_threads=1)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum())), lengths


def _write_chunk(
    chunk: _Chunk, encoded: tuple[np.ndarray, np.ndarray], writers: dict[str, _SplitWriter], spool: _Spool
) -> None:
    flat, lengths = encoded
    if spool.document is not None and spool.document.valid is not None:  # its split is known now
        writers["valid" if spool.document.valid else "train"].append_spool(spool)
    flags = [v if isinstance(v, bool) else v.valid for v in chunk.valid]
    if flags[-1] is None:
        # The pieces of the one document whose split is not known yet close the chunk (it was read last):
        # their tokens wait in the spool. None of them ends it: its last piece comes with its split.
        first = flags.index(None)
        document = chunk.valid[first]
        assert isinstance(document, _Long) and all(v is document for v in chunk.valid[first:])
        split = int(lengths[:first].sum())
        spool.append(document, flat[split:])
        flat, lengths, flags = flat[:split], lengths[:first], flags[:first]
        if not first:
            return
    valid = np.array(flags, dtype=bool)
    n_bytes = np.array(chunk.n_bytes[: len(flags)], dtype=np.int64)
    ends = np.array(chunk.ends[: len(flags)], dtype=bool)
    if not valid.any():
        writers["train"].append(flat, lengths, int(n_bytes.sum()), ends)
        return
    per_token = np.repeat(valid, lengths)
    for name, docs, toks in (("train", ~valid, ~per_token), ("valid", valid, per_token)):
        writers[name].append(flat[toks], lengths[docs], int(n_bytes[docs].sum()), ends[docs])


def encode_documents(
    sources: Sequence[Source],
    tokenizer: Tokenizer,
    directory: Path,
    config: TokenizeConfig,
    progress: Progress,
    bad: src.BadRecords | None = None,
) -> tuple[dict[str, SplitCounts], list[int], int]:
    """Encode every document into `directory`; returns split counts, documents per source, empty documents.
    Malformed records are counted in `bad`."""
    dtype = token_dtype(tokenizer.vocab_size)
    threads = config.num_threads or default_threads()
    writers = {name: _SplitWriter(directory, name, dtype, tokenizer.specials.unk) for name in SPLITS}
    spool = _Spool(directory, tokenizer.specials.unk)
    per_source = [0] * len(sources)
    empty = 0
    progress.start("encoding", sum(s.size for s in sources))
    pending: collections.deque[tuple[_Chunk, Future[tuple[np.ndarray, np.ndarray]]]] = collections.deque()
    # `threads` workers each encode whole chunks on one sentencepiece thread (the GIL is released while it
    # runs): no barrier at the end of a chunk, and this thread keeps reading and writing meanwhile. At most
    # 2 * threads chunks are in flight, which bounds memory; results are written in submission order.
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:

            def submit(chunk: _Chunk) -> None:
                if chunk.texts:
                    pending.append((chunk, pool.submit(_encode_chunk, tokenizer, chunk.texts, dtype)))
                    progress.advance(chunk.size)
                while pending and (len(pending) > 2 * threads or not chunk.texts or pending[0][1].done()):
                    done, future = pending.popleft()
                    _write_chunk(done, future.result(), writers, spool)

            chunk = _Chunk()
            long: _Long | None = None  # the document in several pieces being read
            for index, piece, last in _pieces(sources, config, bad):
                data = piece.encode("utf-8")
                valid: bool | _Long
                if long is None and last:  # a whole document in one piece
                    if not data:
                        empty += 1
                        continue
                    per_source[index] += 1
                    valid, n_bytes = _in_valid(sources[index], data, config), len(data)
                else:  # a piece of a long document: its split is a hash of all its bytes
                    if long is None:
                        per_source[index] += 1
                        long = _Long(_hasher(config.seed), valid=_split_known(sources[index], config))
                    long.hasher.update(data)
                    long.n_bytes += len(data)
                    valid, n_bytes = long, 0
                    if last:
                        if long.valid is None:
                            long.valid = _digest_keys(long.hasher)[0] < config.valid_fraction
                        n_bytes = long.n_bytes  # the document's bytes, once, with its last piece
                        long = None
                del data
                chunk.texts.append(piece)
                chunk.valid.append(valid)
                chunk.n_bytes.append(n_bytes)
                chunk.ends.append(last)
                chunk.size += len(piece)
                if chunk.size >= config.chunk_bytes:
                    submit(chunk)
                    chunk = _Chunk()
            submit(chunk)
            submit(_Chunk())
        assert spool.document is None, "a long document's pieces were left in the spool"
    except BaseException:
        for writer in writers.values():
            writer.abort()
        spool.close()
        raise
    spool.close()
    for writer in writers.values():
        writer.close()
    return {name: w.counts for name, w in writers.items()}, per_source, empty


def tokenize_corpus(
    inputs: Sequence[Path],
    output: Path,
    config: TokenizeConfig | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> TokenizeSummary:
    """Build a token store at `output` from files, directories and/or a built-in corpus.

    Raises `UserError` for bad input; `output` then stays as it was (written atomically).
    """
    config = config or TokenizeConfig()
    progress = progress or Progress()
    output = Path(output)
    _check_config(config, inputs)
    for path in inputs:  # before anything resolves them: a link loop is one line, not a traceback
        src.check_input(Path(path))
    extra = [config.tokenizer] if config.tokenizer is not None else []
    if config.tokenizer is not None:
        src.check_input(Path(config.tokenizer), "--tokenizer")
    check_output_free(output, force, inputs=[*inputs, *extra], replaces=("an objtrain store", (META_FILE,)))
    start = time.perf_counter()
    dataset_dicts: list[src.DatasetDictSplits] = []
    sources, skipped = collect_sources(inputs, config, progress, output, dataset_dicts)

    train_seconds = 0.0
    if config.tokenizer is not None:
        tokenizer, model_type = load_tokenizer(config.tokenizer, config.n_sentinels)
    else:
        specials = Specials(n_sentinels=config.n_sentinels)
        sample = sample_for_training(sources, config, progress)
        progress.start("training tokenizer", 0)
        t0 = time.perf_counter()
        lines = (line for text in sample for line in text.splitlines(keepends=True))
        model = train_sentencepiece(
            lines,
            config.vocab_size,
            config.model_type,
            specials,
            num_threads=config.num_threads or default_threads(),
            byte_fallback=config.byte_fallback,
        )
        train_seconds = time.perf_counter() - t0
        tokenizer, model_type = Tokenizer(model, specials), config.model_type

    bad = src.BadRecords(config.strict)
    with atomic_dir(output, force=force) as tmp:
        splits, per_source, empty = encode_documents(sources, tokenizer, tmp, config, progress, bad)
        if sum(s.documents for s in splits.values()) == 0:
            why = (
                f" ({bad.count} malformed records skipped, e.g. {bad.examples[0]['reason']})"
                if bad.count
                else ""
            )
            raise UserError(f"empty corpus: the inputs hold no text{why}")
        (tmp / tokenizer.file_name).write_bytes(tokenizer.model_proto)
        meta = _meta(config, tokenizer, splits, sources, per_source, skipped, empty, model_type)
        meta["malformed_records"] = {"count": bad.count, "first": bad.examples}
        if dataset_dicts:  # whose splits went where: the folder's own, not a re-split by hash
            meta["dataset_dicts"] = [d.to_dict() for d in dataset_dicts]
        write_json(tmp / META_FILE, meta)
    return TokenizeSummary(
        path=output,
        splits=splits,
        n_sources=len(sources),
        skipped=skipped,
        empty_documents=empty,
        bad_records=bad,
        vocab_size=tokenizer.vocab_size,
        tokenizer_trained=config.tokenizer is None,
        train_seconds=train_seconds,
        seconds=time.perf_counter() - start,
        tokenizer_note=_tokenizer_note(tokenizer),
        dataset_dicts=dataset_dicts,
    )


def _tokenizer_note(tokenizer: Tokenizer) -> str:
    base = getattr(tokenizer, "base_size", None)
    if tokenizer.kind != "huggingface" or base is None:
        return ""
    added = tokenizer.vocab_size - base
    note = (
        f"Hugging Face tokenizer: {added} of objtrain's special tokens added after its {base:,} ids, "
        f"{N_FIXED + tokenizer.specials.n_sentinels - added} found in it (ids in meta.json)"
    )
    if not tokenizer.byte_fallback:
        note += "; it is not lossless: a probe of hard text did not decode back exactly"
    return note


def _meta(
    config: TokenizeConfig,
    tokenizer: Tokenizer,
    splits: dict[str, SplitCounts],
    sources: Sequence[Source],
    per_source: Sequence[int],
    skipped: Sequence[Skipped],
    empty: int,
    model_type: str,
) -> dict[str, Any]:
    """meta.json: everything needed to read the store, and to tell what it was made from (no timestamps,
    so the same inputs give a byte-identical store)."""
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    for name in ("num_threads", "chunk_bytes"):  # do not change the result
        options.pop(name)
    options["include"], options["exclude"] = list(config.include), list(config.exclude)
    return {
        "kind": "token_store",
        "format_version": TOKEN_STORE_VERSION,
        "dtype": token_dtype(tokenizer.vocab_size).str,
        "vocab_size": tokenizer.vocab_size,
        "documents": sum(s.documents for s in splits.values()),
        "tokens": sum(s.tokens for s in splits.values()),
        "bytes": sum(s.bytes for s in splits.values()),
        "splits": {name: asdict(counts) for name, counts in splits.items()},
        "empty_documents_dropped": empty,
        "tokenizer": {
            "file": tokenizer.file_name,
            "kind": tokenizer.kind,
            "hash": tokenizer.hash,
            "model_type": model_type,
            "vocab_size": tokenizer.vocab_size,
            "byte_fallback": tokenizer.byte_fallback,
            "trained_here": config.tokenizer is None,
            **({"round_trip": tokenizer.byte_fallback} if tokenizer.kind == "huggingface" else {}),
        },
        "specials": tokenizer.specials.to_dict(),
        "special_pieces": {
            name: tokenizer.piece(getattr(tokenizer.specials, name)) for name in fixed_special_names()
        },
        "options": options,
        "python": platform.python_version() if config.corpus == "stdlib" else None,
        "sources": [
            {
                "path": str(s.path),
                "format": s.format,
                "compressed": s.compressed,
                "compression": s.compression or None,
                "bytes": s.size,
                "sha256": s.sha256,
                "documents": n,
                **({"split": s.split} if s.split is not None else {}),
            }
            for s, n in zip(sources, per_source, strict=True)
        ],
        "skipped": [{"path": str(s.path), "reason": s.reason} for s in skipped],
    }
