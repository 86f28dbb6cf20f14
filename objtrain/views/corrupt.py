"""Looking at what an objective does to real rows: the library behind `objtrain corrupt`.

- `read_rows`: a token store, a packed store, a mixture (a YAML with `data.sources`, such as a train
  config), a text file or a string -> raw rows (B, L) with document ids and global row indices: a token
  store's and a text's rows as long as training cuts them for the objective, a packed store's rows as they
  were packed (training streams its documents instead), a mixture's rows each from the source training
  draws for it under the seed;
- `attention_mask`: the (B, T, T) pattern a model builds from a `Batch` (the rules of `objtrain.batch`);
- `align_row`: original, model input and target of one row, aligned column by column and classified
  (kept / masked / replaced / deleted / inserted / sentinel / special) for display;
- `collect_stats`: realised corruption rates over many rows beside the configured ones;
- `row_record`: one JSON-ready object per row for `--format jsonl`;
- `list_objectives`: every registered objective with its model kinds, attention and defaults.

Nothing here is on the training path, so per-row Python (difflib alignment, piece lookup) is fine.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, ModelKind
from objtrain.data.batches import leading_rows, read_batch
from objtrain.data.mixture import StoreMixture, open_stores
from objtrain.data.store_reader import DataSource, is_packed_store
from objtrain.data.stream import (
    Documents,
    DocumentStream,
    MixedStream,
    as_mixed,
    row_needs,
    row_starts,
)
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective
from objtrain.specials import FIXED_PIECES, N_FIXED, Specials

# ---------------------------------------------------------------------------------------------------
# StoreMixture -> raw rows


@dataclass
class RawRows:
    """Raw rows as an objective receives them."""

    tokens: Tensor  # (B, L) int64, pad where document_ids == -1
    document_ids: Tensor  # (B, L) int64, 0, 1, ... per row, -1 = padding
    row_index: Tensor  # (B,) int64 global row index in the source
    specials: Specials
    tokenizer: Tokenizer | None
    source: str  # "packed", "tokens", "text"
    # Where the rows were read: the unshuffled document stream, each row's offset in it and its raw tokens
    # (its need, or less at the end of the source); None for rows built by hand (no donor text then).
    stream: DocumentStream | MixedStream | None = None
    offsets: np.ndarray | None = None
    lengths: np.ndarray | None = None
    # A mixture: each row's source (index into `source_names`), as training draws it under the seed.
    row_sources: np.ndarray | None = None
    source_names: list[str] = field(default_factory=list)

    def source_of(self, row_index: int) -> str | None:
        """The name of the source global row `row_index` was read from (None: not a mixture)."""
        if self.row_sources is None:
            return None
        at = int(np.flatnonzero(self.row_index.numpy() == row_index)[0])
        return self.source_names[int(self.row_sources[at])]


def mixture_file(path: Path | None) -> bool:
    """A YAML file that names data (a train config's `data:` or a bare `sources:` list): a mixture to read
    as training does, not text to corrupt."""
    if path is None or not Path(path).is_file() or Path(path).suffix not in (".yaml", ".yml"):
        return False
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and ("data" in doc or "sources" in doc)


def open_mixture(path: Path) -> StoreMixture:
    """The stores a YAML file's `data:` section (or its bare `sources:` list) names, checked as `train`
    checks them (one tokenizer)."""
    from objtrain.config import from_dict, load_yaml
    from objtrain.training.config import DataConfig

    doc = load_yaml(Path(path))
    section = doc.get("data") if "data" in doc else {"sources": doc.get("sources")}
    data = from_dict(DataConfig, section or {}, where=f"{path}: data")
    if data.store is None and not data.sources:
        raise UserError(f"{path} names no data: give data.store or data.sources")
    return open_stores(data.store, data.sources)


def open_token_store(path: Path) -> Any:
    """`TokenStore.open(path)`, with a clear error if `path` is missing."""
    from objtrain.data.store import TokenStore

    if not Path(path).exists():
        raise UserError(f"source not found: {path}")
    return TokenStore.open(Path(path))


def load_text_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer for text sources: a token store directory or a sentencepiece .model file."""
    from objtrain.data.tokenize import load_tokenizer

    return load_tokenizer(Path(path))[0]


def rows_from_documents(
    docs: Iterable[Sequence[int] | Tensor], raw_length: int, n_rows: int, specials: Specials
) -> tuple[Tensor, Tensor]:
    """Concatenate documents, each followed by EOS, and cut the stream into rows of `raw_length`.

    Returns tokens and document ids, both (n, raw_length) with n <= n_rows; a document that crosses a row
    end continues at the start of the next row (as a new document there). A last, partial row is padded.
    When the whole stream is shorter than one row, the single row is exactly as long as the stream.
    """
    if raw_length < 1:
        raise UserError(f"rows must hold at least one raw token, got {raw_length}")
    need = raw_length * n_rows
    parts: list[Tensor] = []
    doc_parts: list[Tensor] = []
    total = 0
    for d, doc in enumerate(docs):
        ids = torch.as_tensor(doc, dtype=torch.int64).reshape(-1)
        ids = torch.cat([ids, torch.tensor([specials.eos])])
        parts.append(ids)
        doc_parts.append(torch.full_like(ids, d))
        total += ids.numel()
        if total >= need:
            break
    if total == 0:
        raise UserError("the source holds no tokens")
    stream = torch.cat(parts)[:need]
    doc_stream = torch.cat(doc_parts)[:need]
    width = min(raw_length, stream.numel())
    n = -(-stream.numel() // width)
    tokens = torch.full((n * width,), specials.pad, dtype=torch.int64)
    docs_out = torch.full((n * width,), -1, dtype=torch.int64)
    tokens[: stream.numel()] = stream
    docs_out[: stream.numel()] = doc_stream
    tokens, docs_out = tokens.view(n, width), docs_out.view(n, width)
    # Renumber documents 0, 1, ... inside each row (a document cut by a row end is new in the next row).
    real = docs_out >= 0
    first = torch.where(real[:, :1], docs_out[:, :1], 0)
    docs_out = torch.where(real, docs_out - first, -1)
    return tokens, docs_out


def read_rows(
    source: Path | None,
    objective: Objective,
    model_length: int,
    n_rows: int,
    seed: int,
    tokenizer_store: Path | None = None,
    text: str | None = None,
) -> RawRows:
    """Rows 0..n_rows-1 of `source` (a token store, packed store or text file) or of `text`, as the training
    loader reads them: the unshuffled document stream cut into rows of the length each row needs
    (`objective.raw_lengths`), never past one pass over the source; a packed store's rows are read as packed
    (each cut to its row's need). Rows keep the stream and their offsets, so donor text (NSP) is read as the
    loader reads it.

    Text needs `tokenizer_store`, a token store (or .model file) whose tokenizer encodes it; a `.jsonl`
    file holds one document per line (its "text" field), any other file is one document.
    """
    if n_rows < 1:
        raise UserError(f"--n must be at least 1, got {n_rows}")
    width = objective.raw_length(model_length)
    index = torch.arange(n_rows, dtype=torch.int64)
    need = row_needs(objective, model_length, index.numpy(), seed)
    packed_lengths = None
    if text is None and mixture_file(source):
        return _mixture_rows(open_mixture(Path(source)), objective, model_length, index, seed)  # type: ignore[arg-type]
    if text is not None or (source is not None and Path(source).is_file()):
        if tokenizer_store is None:
            raise UserError("text needs a tokenizer: pass --tokenizer TOKEN_STORE (or a .model file)")
        tokenizer = load_text_tokenizer(tokenizer_store)
        documents = [text] if text is not None else _text_documents(Path(source))  # type: ignore[arg-type]
        if not any(documents):  # as `objtrain tokenize` refuses an empty corpus
            raise UserError("--text is empty" if text is not None else f"{source} holds no text")
        encoded = [np.asarray(d, dtype=np.int64) for d in tokenizer.encode_batch(documents, num_threads=1)]
        docs = Documents.of(encoded)
        specials, kind = tokenizer.specials, "text"
        stream = DocumentStream(docs, specials.eos, specials.pad, seed=0, shuffle=False)
    else:
        if source is None:
            raise UserError("give a SOURCE (token store, packed store or text file) or --text")
        path = Path(source)
        if not path.exists():
            raise UserError(f"source not found: {path}")
        data = DataSource(path)
        tokenizer, specials = data.tokenizer, data.specials
        if data.packed_length is not None:
            kind = "packed"
            if width > data.packed_length:
                raise UserError(
                    f"{path} holds rows of {data.packed_length} raw tokens, the objective needs {width} for "
                    "this --seq-len: lower --seq-len or re-pack with a longer --seq-len"
                )
            split = data.store.split("train")  # type: ignore[call-arg]
            if len(split) == 0:
                raise UserError(f"{path} holds no rows")
            real = (np.asarray(split.document_ids[: min(n_rows, len(split))]) >= 0).sum(axis=1)
            packed_lengths = real.astype(np.int64)
        else:
            kind = "tokens"
        stream = data.stream("train", 0, shuffle=False)
    if packed_lengths is not None:  # packed row i starts where rows < i end in the stream of packed rows
        n = len(packed_lengths)
        offsets = row_starts(packed_lengths)[:n]
        lengths = np.minimum(need[:n], packed_lengths)
    else:
        # the rows the loader lays out (`leading_rows`), with one difference on purpose: a source shorter
        # than one row is shown once, as one row exactly as long as it, where training reads it round
        lead = leading_rows(stream, objective, model_length, n_rows, seed)
        n = lead.n
        offsets = lead.offsets[:n]
        lengths = np.minimum(lead.lengths[:n], stream.epoch_tokens)
        if stream.epoch_tokens < width:
            width = stream.epoch_tokens
    tokens, document_ids = stream.rows(offsets, lengths, width)
    return RawRows(tokens, document_ids, index[:n], specials, tokenizer, kind, stream, offsets, lengths)


def _mixture_rows(
    sources: StoreMixture, objective: Objective, model_length: int, index: Tensor, seed: int
) -> RawRows:
    """Rows of a mixture: each row's source drawn as training draws it under `seed`, its text from that
    source's unshuffled stream after the rows before it that drew the same source."""
    mixed = as_mixed(sources.stream("train", seed, shuffle=False))
    lead = leading_rows(mixed, objective, model_length, len(index), seed)
    n, which, offsets, need = lead.n, lead.sources, lead.offsets, lead.lengths
    width = objective.raw_length(model_length)
    tokens, document_ids = mixed.rows(which[:n], offsets[:n], need[:n], width)
    return RawRows(
        tokens,
        document_ids,
        index[:n],
        sources.specials,
        sources.tokenizer,
        "mixture",
        mixed,
        offsets[:n],
        need[:n],
        which[:n],
        list(sources.names),
    )


def _text_documents(path: Path) -> list[str]:
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    if path.suffix != ".jsonl":
        return [raw]
    documents = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{path}:{n} is not valid JSON") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise UserError(f'{path}:{n} needs a string "text" field')
        documents.append(obj["text"])
    return documents


def packed_row_length(source: Path | None) -> int | None:
    """Raw row length of a packed store (to choose a default --seq-len), else None."""
    if source is None or not Path(source).is_dir() or not is_packed_store(Path(source)):
        return None
    from objtrain.data.store import PackedStore

    return int(PackedStore.open(Path(source)).seq_len)


def model_length_for(objective: Objective, raw_length: int) -> int:
    """Largest model length m with `objective.raw_length(m) <= raw_length` (raw_length is monotone)."""
    lo, hi = 1, raw_length
    best = 0
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            fits = objective.raw_length(mid) <= raw_length
        except UserError:
            fits = False
        if fits:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best == 0:
        raise UserError(f"rows of {raw_length} raw tokens are too short for {objective.name}")
    return best


# ---------------------------------------------------------------------------------------------------
# Attention


def attention_mask(batch: Batch) -> Tensor:
    """(B, T, T) bool, True where query i may attend to key j, from the rules in `objtrain.batch`:
    same document (padding, id -1, is its own document) and causal (j <= i), bidirectional, or prefix
    (j <= i, or both i and j in the prefix given by `prefix_mask`)."""
    docs = batch.document_ids
    T = docs.size(1)
    allowed = docs[:, :, None] == docs[:, None, :]
    if batch.attention == "bidirectional":
        return allowed
    causal = torch.ones(T, T, dtype=torch.bool, device=docs.device).tril()[None]
    if batch.attention == "prefix":
        if batch.prefix_mask is None:
            raise ValueError("prefix attention needs batch.prefix_mask")
        pm = batch.prefix_mask.bool()
        causal = causal | (pm[:, :, None] & pm[:, None, :])
    elif batch.attention != "causal":
        raise ValueError(f"unknown attention kind {batch.attention!r}")
    return allowed & causal


def decoder_attention_mask(batch: Batch) -> Tensor:
    """(B, S, S) decoder self-attention of an encoder-decoder batch: causal inside decoder documents."""
    if batch.decoder_document_ids is None:
        raise ValueError("not an encoder-decoder batch")
    docs = batch.decoder_document_ids
    S = docs.size(1)
    causal = torch.ones(S, S, dtype=torch.bool, device=docs.device).tril()[None]
    return (docs[:, :, None] == docs[:, None, :]) & causal


def cross_attention_mask(batch: Batch) -> Tensor:
    """(B, S, T): decoder position s sees the encoder positions of its own document."""
    if batch.decoder_document_ids is None:
        raise ValueError("not an encoder-decoder batch")
    return batch.decoder_document_ids[:, :, None] == batch.document_ids[:, None, :]


def attention_summary(batch: Batch, b: int) -> list[dict[str, Any]]:
    """Per document of row b: its span of positions, length and pattern (prefix length when prefix)."""
    docs = batch.document_ids[b]
    out = []
    for d in torch.unique_consecutive(docs).tolist():
        where = (docs == d).nonzero().squeeze(1)
        entry: dict[str, Any] = {
            "document": int(d),
            "start": int(where[0]),
            "end": int(where[-1]) + 1,
            "length": int(where.numel()),
            "pattern": "padding" if d < 0 else batch.attention,
        }
        if batch.attention == "prefix" and batch.prefix_mask is not None and d >= 0:
            entry["prefix_length"] = int(batch.prefix_mask[b, where].sum())
        out.append(entry)
    return out


def downsample_mask(mask: Tensor, cells: int) -> Tensor:
    """(T, T) bool -> (c, c) float share of allowed pairs per cell, c = min(T, cells) (summed-area table)."""
    T = mask.size(0)
    c = min(T, cells)
    edges = torch.linspace(0, T, c + 1).round().long()
    table = torch.zeros(T + 1, T + 1, dtype=torch.float64)
    table[1:, 1:] = mask.double().cumsum(0).cumsum(1)
    lo, hi = edges[:-1], edges[1:]
    sums = table[hi][:, hi] - table[lo][:, hi] - table[hi][:, lo] + table[lo][:, lo]
    area = (hi - lo).double()
    return (sums / (area[:, None] * area[None, :])).float()


# ---------------------------------------------------------------------------------------------------
# Pieces and alignment

KEPT = "kept"  # cell kinds, for colouring
MASKED = "masked"
REPLACED = "replaced"
DELETED = "deleted"
INSERTED = "inserted"
SENTINEL = "sentinel"
SPECIAL = "special"
_SPECIAL_NAMES = {i: piece for i, (_, piece) in enumerate(FIXED_PIECES)}
_VISIBLE = str.maketrans({"\u2581": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", " ": "␣"})


def piece_text(token: int, specials: Specials, tokenizer: Tokenizer | None) -> str:
    """A visible rendering of one token: whitespace made visible, specials by name, else the id."""
    if specials.own_layout and token < N_FIXED:
        return _SPECIAL_NAMES.get(token, f"<{token}>")
    if token in specials.fixed_ids:
        return FIXED_PIECES[specials.fixed_ids.index(token)][1]
    if specials.sentinel_index(token) is not None:
        return f"<extra_id_{specials.sentinel_index(token)}>"
    if tokenizer is None or token >= tokenizer.vocab_size:
        return str(token)
    piece = tokenizer.piece(token)
    if tokenizer.kind != "sentencepiece" and tokenizer.concatenative:  # byte-level pieces: show their text
        piece = tokenizer.piece_bytes(token).decode("utf-8", "replace") or piece
    if piece == "<0x0A>":
        return "⏎"
    if piece == "<0x09>":
        return "⇥"
    return piece.translate(_VISIBLE)


def token_kind(token: int, specials: Specials) -> str:
    if token == specials.mask:
        return MASKED
    if specials.sentinel_index(token) is not None:
        return SENTINEL
    if specials.is_special_id(token):
        return SPECIAL
    return KEPT


@dataclass
class Cell:
    """One aligned column: a token of the original, of the input and the target at that input position."""

    original: int | None
    original_kind: str
    input: int | None
    input_kind: str
    target: int | None  # label at this input position (decoder-only / encoder layouts)


@dataclass
class RowView:
    """Everything shown for one row."""

    row_index: int
    original: list[int]
    input: list[int]
    labels: list[int]  # aligned labels (input positions, or decoder positions for encoder-decoder)
    targets: list[int]  # the labelled tokens only, in order
    cells: list[Cell]
    encdec: bool
    aligned: bool = True  # False: the input rearranges the original; cells hold the input only
    decoder_input: list[int] = field(default_factory=list)
    seq_labels: list[int] | None = None  # one sequence label per pair, in row order (NSP/SOP)
    stats: dict[str, float] = field(default_factory=dict)


def align_row(batch: Batch, b: int, raw: RawRows, raw_b: int) -> RowView:
    """Align row b of `batch` with raw row `raw_b`: difflib over the original and input tokens, so kept
    text lines up, deletions show in the original only and inserted tokens (sentinels, mode tokens, FIM
    markers) in the input only. Labels travel with their input position unless encoder-decoder."""
    specials = raw.specials
    real = raw.document_ids[raw_b] >= 0
    original = raw.tokens[raw_b][real].tolist()
    in_real = batch.document_ids[b] >= 0
    inputs = batch.input_ids[b][in_real].tolist()
    encdec = batch.is_encdec
    if encdec:
        dec_real = batch.decoder_document_ids[b] >= 0  # type: ignore[index]
        labels = batch.labels[b][dec_real].tolist()
        in_labels: list[int] = [IGNORE] * len(inputs)
    else:
        labels = batch.labels[b][in_real].tolist()
        in_labels = labels
    targets = [t for t in labels if t != IGNORE]

    cells: list[Cell] = []
    for op, i1, i2, j1, j2 in _opcodes(original, inputs):
        if op == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2), strict=True):
                kind = SPECIAL if specials.is_special_id(original[i]) else KEPT
                cells.append(Cell(original[i], kind, inputs[j], kind, in_labels[j]))
            continue
        n = max(i2 - i1, j2 - j1)
        for k in range(n):
            i, j = i1 + k, j1 + k
            orig = original[i] if i < i2 else None
            tok = inputs[j] if j < j2 else None
            if tok is None:
                in_kind = ""
            else:
                in_kind = token_kind(tok, specials)
                if in_kind == KEPT:
                    in_kind = REPLACED if orig is not None and op == "replace" else INSERTED
            if orig is None:
                orig_kind = ""
            elif tok is not None and in_kind in (MASKED, REPLACED):
                orig_kind = KEPT  # shown in place, corrupted in the input
            else:
                orig_kind = DELETED
            cells.append(Cell(orig, orig_kind, tok, in_kind, in_labels[j] if tok is not None else None))
    aligned = 2 * sum(c.input_kind in (KEPT, SPECIAL) and c.original is not None for c in cells) >= len(
        inputs
    )
    if not aligned:
        # A rearranged row (FIM, permuted sentences): an edit script would pair unrelated tokens, so the
        # original is shown on its own and the input with its targets.
        cells = [
            Cell(None, "", tok, token_kind(tok, specials), lab)
            for tok, lab in zip(inputs, in_labels, strict=True)
        ]
    view = RowView(
        aligned=aligned,
        row_index=int(raw.row_index[raw_b]),
        original=original,
        input=inputs,
        labels=labels,
        targets=targets,
        cells=cells,
        encdec=encdec,
    )
    if encdec:
        view.decoder_input = batch.decoder_input_ids[b][dec_real].tolist()  # type: ignore[index]
    if batch.seq_labels is not None:
        labelled = batch.seq_labels[b]
        view.seq_labels = labelled[labelled != IGNORE].tolist()
    view.stats = row_stats(view, specials)
    return view


def _opcodes(original: list[int], inputs: list[int]) -> list[tuple[str, int, int, int, int]]:
    """Edit operations from `original` to `inputs`. Inputs that keep the raw layout (MLM, CLM: same length
    or one shorter, mostly equal in place) align position by position, so a random replacement shows as
    replaced rather than as a deletion plus an insertion; anything else goes through difflib."""
    n = min(len(original), len(inputs))
    if abs(len(original) - len(inputs)) <= 1 and n:
        same = sum(a == b for a, b in zip(original, inputs, strict=False))
        if same >= n // 2:
            ops = []
            for i in range(n):
                op = "equal" if original[i] == inputs[i] else "replace"
                if ops and ops[-1][0] == op:
                    ops[-1] = (op, ops[-1][1], i + 1, ops[-1][3], i + 1)
                else:
                    ops.append((op, i, i + 1, i, i + 1))
            if len(original) > n:
                ops.append(("delete", n, len(original), n, n))
            elif len(inputs) > n:
                ops.append(("insert", n, n, n, len(inputs)))
            return ops
    # difflib is a heuristic, not a minimal edit script: on very repetitive text it can show a kept token
    # as deleted and re-inserted. Good enough to look at; the objective's own stats are exact.
    return difflib.SequenceMatcher(a=original, b=inputs, autojunk=False).get_opcodes()


def row_stats(view: RowView, specials: Specials) -> dict[str, float]:
    """What was realised in one row, measured by comparing the original with the input and labels."""
    counts = {k: 0 for k in (MASKED, REPLACED, DELETED, INSERTED, SENTINEL)}
    for cell in view.cells:
        if cell.input_kind in counts:
            counts[cell.input_kind] += 1
        if cell.original_kind == DELETED:
            counts[DELETED] += 1
    n_orig = len(view.original)
    ordinary = sum(1 for t in view.original if not specials.is_special_id(t))
    return {
        "original_tokens": float(n_orig),
        "input_tokens": float(len(view.input)),
        "targets": float(len(view.targets)),
        "target_rate": len(view.targets) / ordinary if ordinary else 0.0,
        "masked": float(counts[MASKED]),
        "replaced": float(counts[REPLACED]),
        "deleted": float(counts[DELETED]),
        "inserted": float(counts[INSERTED]),
        "sentinel": float(counts[SENTINEL]),
    }


# ---------------------------------------------------------------------------------------------------
# Records and stats


def row_record(objective: Objective, view: RowView, batch: Batch, b: int, raw: RawRows) -> dict[str, Any]:
    """One JSON-ready object per row for `--format jsonl`."""
    specials, tok = raw.specials, raw.tokenizer
    record: dict[str, Any] = {
        "objective": objective.name,
        "model_kind": objective.model_kind,
        "row_index": view.row_index,
        **({"source": raw.source_of(view.row_index)} if raw.row_sources is not None else {}),
        "original": view.original,
        "input": view.input,
        "target": view.targets,
        "labels": view.labels,
        "input_pieces": [piece_text(t, specials, tok) for t in view.input],
        "target_pieces": [piece_text(t, specials, tok) for t in view.targets],
        "attention": {
            "kind": batch.attention,
            "document_ids": batch.document_ids[b].tolist(),
            "positions": batch.positions[b].tolist(),
            "documents": attention_summary(batch, b),
        },
        "stats": view.stats,
    }
    if batch.prefix_mask is not None:
        record["attention"]["prefix_mask"] = [int(x) for x in batch.prefix_mask[b].tolist()]
    if view.encdec:
        record["decoder_input"] = view.decoder_input
        record["attention"]["decoder_document_ids"] = batch.decoder_document_ids[b].tolist()  # type: ignore[index]
    if view.seq_labels is not None:
        record["seq_labels"] = view.seq_labels
    if batch.segment_ids is not None:
        record["segment_ids"] = batch.segment_ids[b].tolist()
    return record


# (numerator, denominator, name of the configured value it realises)
DERIVED: tuple[tuple[str, str, str], ...] = (
    ("selected", "eligible", "selection_rate"),
    ("masked", "selected", "mask_prob"),
    ("random", "selected", "random_prob"),
    ("kept", "selected", "keep_prob"),
    ("noise_tokens", "raw_tokens", "noise_density"),
    ("noise_tokens", "spans", "mean_noise_span_length"),
    ("suffix_tokens", "raw_tokens", "noise_density"),
    ("fim_fragments", "fragments", "fim_rate"),
    ("spm_fragments", "fim_fragments", "fim_spm_rate"),
    ("random_replacements", "spans", "mask_random"),
)
_MEAN_KEYS = ("noise_density", "mean_span_length")


def _is_mean(key: str) -> bool:
    last = key.rsplit("/", 1)[-1]
    return key.startswith("share/") or last in _MEAN_KEYS or "rate" in last or "fraction" in last


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Config dataclass (or dict) -> {dotted key: scalar}."""
    data = vars(config) if hasattr(config, "__dataclass_fields__") else config
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{prefix}{key}"
            if hasattr(value, "__dataclass_fields__") or isinstance(value, dict):
                out.update(flatten(value, f"{name}."))
            else:
                out[name] = value
    return out


@dataclass
class StatRow:
    name: str
    realised: float
    configured: float | None = None


@dataclass
class Aggregate:
    """Realised corruption over many rows."""

    rows: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)  # row-weighted sums of per-batch rates
    measured: dict[str, float] = field(default_factory=dict)  # summed `row_stats`
    positions: dict[str, float] = field(default_factory=dict)  # input/target positions and their padding

    def add(self, batch: Batch, views: list[RowView]) -> None:
        B = int(batch.input_ids.size(0))
        self.rows += B
        p = self.positions
        p["input"] = p.get("input", 0.0) + batch.document_ids.numel()
        p["input_padding"] = p.get("input_padding", 0.0) + float((batch.document_ids < 0).sum())
        target_docs = batch.decoder_document_ids if batch.is_encdec else batch.document_ids
        assert target_docs is not None
        p["target"] = p.get("target", 0.0) + target_docs.numel()
        p["target_padding"] = p.get("target_padding", 0.0) + float((target_docs < 0).sum())
        if batch.seq_labels is not None:
            valid = batch.seq_labels != IGNORE
            p["pairs"] = p.get("pairs", 0.0) + float(valid.sum())
            p["label_1"] = p.get("label_1", 0.0) + float((batch.seq_labels == 1).sum())
        for key, value in batch.stats.items():
            if _is_mean(key):
                self.means[key] = self.means.get(key, 0.0) + float(value) * B
            else:
                self.sums[key] = self.sums.get(key, 0.0) + float(value)
        for view in views:
            for key, value in view.stats.items():
                if key != "target_rate":
                    self.measured[key] = self.measured.get(key, 0.0) + value

    def table(self, objective: Objective) -> list[StatRow]:
        """Realised values beside the configured ones, where the objective's config names them."""
        configured = flatten(objective.config)
        shares = configured_shares(objective)
        out: list[StatRow] = []
        for key in sorted(self.means):
            value = self.means[key] / max(self.rows, 1)
            if key in _MEAN_KEYS or key.rsplit("/", 1)[-1] in _MEAN_KEYS:
                continue  # recomputed from the summed counts below
            out.append(StatRow(key, value, shares.get(key, _number(configured.get(key)))))
        prefixes = sorted({k.rpartition("/")[0] for k in self.sums})
        for prefix in prefixes:
            scoped = {k.rpartition("/")[2]: v for k, v in self.sums.items() if k.rpartition("/")[0] == prefix}
            for num, den, name in DERIVED:
                if num in scoped and den in scoped and scoped[den] > 0:
                    conf = _number(configured.get(name)) if not prefix else None
                    if name == "keep_prob" and not prefix:
                        mp, rp = _number(configured.get("mask_prob")), _number(configured.get("random_prob"))
                        conf = 1.0 - mp - rp if mp is not None and rp is not None else None
                    label = f"{name} = {num}/{den}"
                    out.append(
                        StatRow(f"{prefix}/{label}" if prefix else label, scoped[num] / scoped[den], conf)
                    )
            for key, value in scoped.items():
                label = f"{prefix}/{key}" if prefix else key
                out.append(StatRow(f"{label} (per row)", value / max(self.rows, 1)))
        m = self.measured
        if m.get("original_tokens"):
            out.append(StatRow("measured: input/original length", m["input_tokens"] / m["original_tokens"]))
            out.append(StatRow("measured: targets/original token", m["targets"] / m["original_tokens"]))
            for key in (MASKED, REPLACED, DELETED, SENTINEL, INSERTED):
                out.append(StatRow(f"measured: {key}/original token", m.get(key, 0.0) / m["original_tokens"]))
        return out


def snake(name: str) -> str:
    """A statistic's label as a snake_case JSON key: `share/R(mu=3,r=0.15)` -> `share_r_mu_3_r_0_15`."""
    out = re.sub(r"[^0-9a-zA-Z]+", "_", name.split(" = ")[0].replace(" (per row)", "_per_row")).strip("_")
    return out.lower()


def summary(aggregate: Aggregate, objective: Objective) -> dict[str, Any]:
    """`corrupt --stats --format json`: one object of realised statistics with snake_case keys.

    Totals over the rows read: `raw_tokens_fed`, `raw_tokens_unused`, `target_tokens_dropped` (null where
    the objective does not report it), the padding shares of input and target positions (decoder-only
    batches: both are the share of the one sequence), `label_share` (share of label 1 among the pairs,
    NSP/SOP), and every figure of the text table (rates, shares, per-row counts) under its snake_case name.
    """
    s, p = aggregate.sums, aggregate.positions
    out: dict[str, Any] = {
        "objective": objective.name,
        "model_kind": objective.model_kind,
        "rows": aggregate.rows,
        "raw_tokens_fed": s.get("raw_tokens_fed"),
        "raw_tokens_unused": s.get("raw_tokens_unused"),
        "target_tokens_dropped": s.get("target_tokens_dropped"),
        "input_padding_share": p.get("input_padding", 0.0) / max(p.get("input", 0.0), 1.0),
        "target_padding_share": p.get("target_padding", 0.0) / max(p.get("target", 0.0), 1.0),
    }
    if out["raw_tokens_fed"] and out["raw_tokens_unused"] is not None:
        out["raw_unused_share"] = out["raw_tokens_unused"] / out["raw_tokens_fed"]
    if "pairs" in p:
        out["label_share"] = p["label_1"] / max(p["pairs"], 1.0)
    configured: dict[str, Any] = {}
    for row in aggregate.table(objective):
        key = snake(row.name)
        if key not in out:
            out[key] = row.realised
            if row.configured is not None:
                configured[key] = row.configured
    for key, value in s.items():  # the summed counts themselves
        out.setdefault(snake(key), value)
    out["configured"] = configured
    return out


def configured_shares(objective: Objective) -> dict[str, float]:
    """`share/<label>` -> configured probability, for objectives that pick a component per row."""
    labels = getattr(objective, "labels", None)
    cumulative = getattr(objective, "cumulative", None)
    if not isinstance(labels, list) or not isinstance(cumulative, Tensor):
        return {}
    probs = torch.diff(cumulative, prepend=cumulative.new_zeros(1)).tolist()
    return {f"share/{label}": p for label, p in zip(labels, probs, strict=False)}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def corrupt_rows(
    objective: Objective, raw: RawRows, seed: int, batch_size: int = 64
) -> Iterator[tuple[Batch, int]]:
    """Apply `objective` to `raw` in batches, as the loader does; yields (batch, index of its first row)."""
    width = raw.tokens.size(1)
    rows = raw.row_index.numpy()
    for start in range(0, raw.tokens.size(0), batch_size):
        sl = slice(start, start + batch_size)
        if raw.stream is None or raw.offsets is None or raw.lengths is None:
            yield objective(raw.tokens[sl], raw.document_ids[sl], raw.row_index[sl], seed), start
            continue
        which = raw.row_sources[sl] if raw.row_sources is not None else None
        batch = read_batch(
            raw.stream, objective, rows[sl], raw.offsets[sl], raw.lengths[sl], width, seed, which
        )
        yield batch, start


# ---------------------------------------------------------------------------------------------------
# Listing


@dataclass
class ObjectiveInfo:
    name: str
    available: bool
    model_kinds: tuple[ModelKind, ...] = ()
    attention: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def list_objectives() -> list[ObjectiveInfo]:
    """Every registered objective; one whose module does not import is listed as unavailable."""
    from objtrain.config import load_yaml
    from objtrain.objectives.registry import OBJECTIVES, config_dir, objective_class

    out = []
    for name in OBJECTIVES:
        try:
            cls = objective_class(name)
        except Exception as exc:  # a broken or missing module must not hide the others
            out.append(ObjectiveInfo(name, False, reason=f"{type(exc).__name__}: {exc}".splitlines()[0]))
            continue
        try:
            defaults = load_yaml(config_dir() / "objectives" / f"{name}.yaml")
        except UserError as exc:
            defaults, reason = {}, str(exc)
        else:
            reason = ""
        out.append(ObjectiveInfo(name, True, tuple(cls.model_kinds), str(cls.attention), defaults, reason))
    return out


def describe_defaults(defaults: dict[str, Any], limit: int = 6) -> str:
    """`key=value` list of the scalar defaults; nested lists are summarised by their length."""
    parts = []
    for key, value in defaults.items():
        if isinstance(value, list):
            parts.append(f"{key}=[{len(value)}]")
        elif isinstance(value, dict):
            parts.append(f"{key}={{...}}")
        else:
            parts.append(f"{key}={value}")
    more = f", +{len(parts) - limit}" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more
