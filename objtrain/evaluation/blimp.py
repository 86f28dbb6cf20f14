"""Minimal pairs (BLiMP, Warstadt et al. 2020): is the grammatical sentence the more probable one?

    pairs = read_pairs(Path("blimp/"))            # a folder of *.jsonl, or one .jsonl / .jsonl.gz
    scores = score_sentences(model, "pll_word", encoded, specials)   # (N,) log-probabilities
    summary = summarize(good > bad, good == bad, pairs)

Pairs are read in the release's format (one JSON object a line: `sentence_good`, `sentence_bad`, `UID`,
`linguistics_term`, ...). A pair is right when the good sentence scores strictly higher; a tie counts as
wrong and the tie rate is reported, so a constant scorer scores 0 with ties 1.0. Accuracy comes overall,
per `linguistics_term` and per paradigm (`UID`), each with its Wilson 95% interval (Wilson 1927).

Each model is scored in a form it trained (`FORMS`; which a checkpoint supports is asked of its objective,
`Objective.pair_forms`, never of its name):

- `causal` (decoders: CLM, FIM, MTP's next-token head, a prefix LM with an empty prefix): the summed
  log-probability of the sentence's tokens behind one end-of-document token `</s>`, the context a packed
  row gives a document (documents are packed behind their predecessor's EOS and carry no BOS; the same
  convention as `objtrain/evaluation/lm.py`). The EOS itself is not scored.
- `pll` (encoders): pseudo-log-likelihood (Salazar et al. 2020, "Masked Language Model Scoring"): each
  token masked in turn, one `<mask>` per copy and no random replacement, the masked token's
  log-probability summed.
- `pll_word` (encoders, the headline): Kauf & Ivanova 2023 ("A Better Way to Do Masked Language Model
  Scoring", PLL-word-l2r): scoring a piece of a multi-piece word also masks that word's later pieces, so a
  word cannot spell itself out (PLL overrates multi-piece words). Word starts are the tokenizer's
  `word_boundary_tables` (whole-word masking's).
- `span` (T5 span corruption, encoder-decoders): each token in turn a one-token noise span: the encoder
  reads the sentence with that token replaced by `<extra_id_0>` and its EOS, the decoder reads the start id
  (pad) and `<extra_id_0>` and scores the token (the targets' layout, `objtrain/objectives/span.py`).
  `span_nlu` (`span_nlg`, `span_s2s`): the same behind UL2's mode token (Tay et al. 2023, R-denoiser).
- `bart_mask` (BART text infilling, encoder-decoders): the encoder reads the sentence with one token
  replaced by one `<mask>` (a one-token infilled span) and its EOS; the decoder reconstructs the whole
  sentence teacher-forced, and the masked token's log-probability at its place is summed over copies.
- `encdec_lm` (prefix LM encoder-decoders, the default for other encoder-decoders): an empty prefix, the
  encoder reads one EOS, the decoder reads the start id then the sentence: the summed log-probability.
- `masked_next` (GPT-BERT, Charpentier & Samuel 2024): bidirectional attention over `</s>` and the sentence
  with one token masked, its log-probability read from the output one position before it (masked
  next-token prediction), summed over copies (a PLL in the hybrid's masked form).

Every form is batched: all copies of all sentences are laid out with index arithmetic, grouped by length,
and scored many rows a forward; the (V, D) unembedding runs only at scored positions.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.specials import Specials

FORMS = ("causal", "pll", "pll_word", "sentinel_span", "span_nlu", "span_nlg", "span_s2s", "bart_mask",
         "encdec_lm", "masked_next")  # fmt: skip
REQUIRED = ("sentence_good", "sentence_bad", "UID", "linguistics_term")
Z95 = 1.959963984540054
LOGIT_ROWS = 1024  # scored positions unembedded at once


@dataclass
class Pairs:
    """Minimal pairs, one entry per pair."""

    good: list[str]
    bad: list[str]
    uid: list[str]
    term: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.good)


def _pair_files(path: Path) -> list[Path]:
    if not path.exists():
        raise UserError(f"--blimp: {path} not found")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))
        if not files:
            raise UserError(f"--blimp: {path} holds no *.jsonl files")
        return files
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        raise UserError(f"--blimp: {path} is not a .jsonl or .jsonl.gz file (or a folder of them)")
    return [path]


def _lines(path: Path) -> Iterable[str]:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                yield from f
        else:
            with path.open(encoding="utf-8") as f:
                yield from f
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(f"--blimp: {path} cannot be read ({type(exc).__name__}: {exc})") from None


def read_pairs(path: Path, per_paradigm: int = 0) -> Pairs:
    """The pairs of a folder of BLiMP `*.jsonl` files or one `.jsonl(.gz)`; any bad line is refused with
    its file and line number. `per_paradigm` > 0 keeps the first that many pairs of each paradigm (`UID`),
    in file order: every paradigm still weighs alike, at a fraction of an encoder's scoring cost."""
    if per_paradigm < 0:
        raise UserError(f"--blimp-per-paradigm must be at least 0, got {per_paradigm}")
    path = Path(path)
    seen: dict[str, int] = {}
    good: list[str] = []
    bad: list[str] = []
    uid: list[str] = []
    term: list[str] = []
    for file in _pair_files(path):
        for n, line in enumerate(_lines(file), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"--blimp: {file} line {n} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"--blimp: {file} line {n} is not a JSON object")
            missing = [k for k in REQUIRED if not isinstance(row.get(k), str)]
            if missing:
                raise UserError(f"--blimp: {file} line {n} has no string field {missing[0]!r}")
            seen[row["UID"]] = seen.get(row["UID"], 0) + 1
            if per_paradigm and seen[row["UID"]] > per_paradigm:
                continue
            good.append(row["sentence_good"])
            bad.append(row["sentence_bad"])
            uid.append(row["UID"])
            term.append(row["linguistics_term"])
    if not good:
        raise UserError(f"--blimp: {path} holds no pairs")
    subset = f" (the first {per_paradigm} pairs of each paradigm)" if per_paradigm else ""
    return Pairs(good, bad, uid, term, str(path) + subset)


# --- statistics -----------------------------------------------------------------------------------------


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (Wilson 1927); (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _cell(correct: np.ndarray, tie: np.ndarray) -> dict[str, float]:
    n = len(correct)
    k = float(correct.sum())
    lo, hi = wilson(k, n)
    return {
        "accuracy": k / max(n, 1),
        "lo": lo,
        "hi": hi,
        "tie_rate": float(tie.sum()) / max(n, 1),
        "pairs": float(n),
    }


def summarize(correct: np.ndarray, tie: np.ndarray, pairs: Pairs) -> dict[str, Any]:
    """Accuracy (ties wrong), tie rate and Wilson interval overall, per linguistics term and per paradigm."""
    correct = np.asarray(correct, dtype=bool) & ~np.asarray(tie, dtype=bool)
    tie = np.asarray(tie, dtype=bool)
    out: dict[str, Any] = {"all": _cell(correct, tie)}
    for key, labels in (("by_term", pairs.term), ("by_paradigm", pairs.uid)):
        arr = np.asarray(labels)
        out[key] = {name: _cell(correct[arr == name], tie[arr == name]) for name in sorted(set(labels))}
    return out


def compare_scores(good: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(right, tie) per pair: right when the good sentence scores strictly higher."""
    good, bad = np.asarray(good, dtype=np.float64), np.asarray(bad, dtype=np.float64)
    return good > bad, good == bad


# --- encoded sentences ----------------------------------------------------------------------------------


@dataclass
class Encoded:
    """Sentences as token ids: `ids` (N, W) padded, `lengths` (N,), `word_start` (N, W) bool."""

    ids: np.ndarray
    lengths: np.ndarray
    word_start: np.ndarray


def encode_sentences(
    sentences: Sequence[list[int]], word_start: Sequence[Sequence[bool]] | None = None, pad: int = 0
) -> Encoded:
    """Pad token-id lists into `Encoded` (`word_start`: every token starts a word when not given)."""
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    W = max(int(lengths.max()) if len(lengths) else 0, 1)
    ids = np.full((len(sentences), W), pad, dtype=np.int64)
    starts = np.ones((len(sentences), W), dtype=bool)
    for i, s in enumerate(sentences):
        ids[i, : len(s)] = s
        if word_start is not None:
            starts[i, : len(s)] = np.asarray(word_start[i], dtype=bool)
    starts[:, 0] = True
    return Encoded(ids, lengths, starts)


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> Encoded:
    """Texts encoded with the checkpoint's tokenizer; word starts from its `word_boundary_tables`."""
    ids = [list(tokenizer.encode(t)) for t in texts]
    begins, ends = (t.numpy() for t in tokenizer.word_boundary_tables)
    enc = encode_sentences(ids, None, tokenizer.specials.pad)
    x = enc.ids.clip(max=len(begins) - 1)
    starts = begins[x]
    starts[:, 1:] |= ends[x[:, :-1]]
    starts[:, 0] = True
    enc.word_start = starts
    return enc


# --- scoring --------------------------------------------------------------------------------------------


def _unembed(model: nn.Module, hidden: Tensor) -> Tensor:
    """Normed hidden (M, D) -> logits (M, V) through the model's (tied or own) output matrix."""
    return hidden @ model.lm_head.unembedding(model.embed.weight).T  # type: ignore[union-attr, operator]


def _target_logprob(model: nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    """log p(target) (M,) float64 from normed hidden states (M, D), in row chunks whose (rows, V) logits stay
    small (a (M, V) product and its logsumexp at once are memory-bound: most of a small model's time)."""
    out = []
    for lo in range(0, hidden.size(0), LOGIT_ROWS):
        logits = _unembed(model, hidden[lo : lo + LOGIT_ROWS]).float()
        out.append(-F.cross_entropy(logits, targets[lo : lo + LOGIT_ROWS], reduction="none"))
    return torch.cat(out).double() if out else hidden.new_zeros(0, dtype=torch.float64)


def batch_tokens_for(device: torch.device | str) -> int:
    """Tokens a forward of copies holds by default. On a CPU a chunk of 2,048 keeps its (rows, width)
    activations in cache: a tiny encoder's pseudo-log-likelihood runs about 1.45x faster than at 16,384
    (benchmarks/bench_blimp.py --batch-tokens), and only the float summation order changes (scores within
    1e-5). An accelerator wants large batches."""
    return 2048 if torch.device(device).type == "cpu" else 16384


def _chunks(widths: np.ndarray, budget: int) -> Iterable[tuple[int, int, int]]:
    """(lo, hi, width) chunks of rows already sorted by width, about `budget` tokens each."""
    lo, n = 0, len(widths)
    while lo < n:
        width = int(widths[min(n - 1, lo)])
        hi = lo + 1
        while hi < n and (hi - lo + 1) * max(width, int(widths[hi])) <= budget:
            width = max(width, int(widths[hi]))
            hi += 1
        yield lo, hi, max(width, 1)
        lo = hi


def _copies(enc: Encoded, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(sentence, position) of every token of every sentence (`keep` (N, W) bool: only those), ordered by
    sentence length so chunks hold rows of one width."""
    W = enc.ids.shape[1]
    valid = np.arange(W)[None, :] < enc.lengths[:, None]
    if keep is not None:
        valid &= keep
    order = np.argsort(enc.lengths, kind="stable")
    sent, pos = np.nonzero(valid[order])
    return order[sent], pos


def _masked_copies(
    enc: Encoded, sent: np.ndarray, pos: np.ndarray, mask_id: int, later_pieces: bool
) -> tuple[Tensor, Tensor]:
    """(rows (M, W), masked (M, W) bool): each copy's sentence with its position masked (and, with
    `later_pieces`, the later pieces of the same word)."""
    ids = torch.from_numpy(enc.ids[sent])
    W = ids.size(1)
    col = torch.arange(W)[None, :]
    p = torch.from_numpy(pos)[:, None]
    masked = col == p
    if later_pieces:
        word = torch.from_numpy(np.cumsum(enc.word_start[sent], axis=1))
        masked |= (
            (col > p) & (word == word.gather(1, p)) & (col < torch.from_numpy(enc.lengths[sent])[:, None])
        )
    return torch.where(masked, mask_id, ids), masked


def _batch(ids: Tensor, valid: Tensor, attention: str, segments: bool = False) -> Batch:
    """One sentence (or copy) a row, pads apart; `segments`: sentence A's segment id 0 at every token, for
    encoders trained on sentence pairs (`objtrain.evaluation.probe.trained_with_segments`)."""
    B, L = ids.shape
    positions = torch.arange(L, device=ids.device).expand(B, L)
    docs = torch.where(valid, 0, -1)
    prefix = valid if attention == "prefix" else None
    seg = torch.zeros_like(ids) if segments else None
    return Batch(ids, ids, positions, docs, attention, prefix_mask=prefix, segment_ids=seg)  # type: ignore[arg-type]


def _encdec_hidden(
    model: nn.Module, enc: Tensor, enc_valid: Tensor, dec: Tensor, dec_valid: Tensor
) -> Tensor:
    batch = _batch(enc, enc_valid, "bidirectional")
    B, S = dec.shape
    batch.decoder_input_ids = dec
    batch.decoder_positions = torch.arange(S, device=dec.device).expand(B, S)
    batch.decoder_document_ids = torch.where(dec_valid, 0, -1)
    trunk = model.trunk(batch)  # type: ignore[operator]
    return model.lm_head.norm(trunk.hidden)  # type: ignore[union-attr, operator]


@torch.no_grad()
def score_sentences(
    model: nn.Module,
    form: str,
    enc: Encoded,
    specials: Specials,
    device: torch.device | str = "cpu",
    batch_tokens: int = 0,  # 0: batch_tokens_for(device)
    segments: bool = False,
) -> np.ndarray:
    """(N,) float64 log-probability of every sentence of `enc` in `form` (see the module docstring)."""
    if form not in FORMS:
        raise UserError(f"unknown minimal-pair form {form!r} (forms: {', '.join(FORMS)})")
    model.eval()
    batch_tokens = batch_tokens or batch_tokens_for(device)
    N = len(enc.lengths)
    total = torch.zeros(N, dtype=torch.float64)
    if form in ("causal", "encdec_lm"):
        order = np.argsort(enc.lengths, kind="stable")
        widths = enc.lengths[order] + 1
        for lo, hi, width in _chunks(widths, batch_tokens):
            rows = order[lo:hi]
            n = torch.from_numpy(enc.lengths[rows])
            body = torch.from_numpy(enc.ids[rows, : max(width - 1, 1)])
            start = specials.eos if form == "causal" else specials.pad
            x = torch.cat([torch.full((len(rows), 1), start), body], 1)[:, :width]  # (b, width)
            col = torch.arange(width)[None, :]
            valid = col <= n[:, None]
            scored = col < n[:, None]  # position t predicts token t (0-based) of the sentence
            targets = torch.cat([body, torch.zeros(len(rows), 1, dtype=torch.int64)], 1)[:, :width]
            x, valid_d = x.to(device), valid.to(device)
            if form == "causal":
                hidden = model.last_hidden(_batch(x, valid_d, "causal"))  # type: ignore[operator]
            else:
                one = torch.full((len(rows), 1), specials.eos, device=device)
                hidden = _encdec_hidden(model, one, torch.ones_like(one, dtype=torch.bool), x, valid_d)
            where = scored.to(device)
            lp = _target_logprob(model, hidden[where], targets.to(device)[where]).cpu()
            row_of = torch.arange(len(rows))[:, None].expand_as(scored)[scored]
            total.index_add_(0, torch.from_numpy(rows)[row_of], lp)
        return total.numpy()
    if form in ("pll", "pll_word"):
        return pll_scores(model, enc, specials, device, batch_tokens, segments)[form == "pll_word"]
    return _copy_scores(model, form, enc, specials, device, batch_tokens)


@torch.no_grad()
def pll_scores(
    model: nn.Module,
    enc: Encoded,
    specials: Specials,
    device: torch.device | str = "cpu",
    batch_tokens: int = 0,  # 0: batch_tokens_for(device)
    segments: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(PLL, PLL-word-l2r) (N,) each, in one pass: a piece that is the last of its word (or a whole word)
    is masked alone in both, so only the other pieces need a second copy."""
    batch_tokens = batch_tokens or batch_tokens_for(device)
    W = enc.ids.shape[1]
    last = np.ones_like(enc.word_start)  # the next position starts a word or lies past the sentence
    last[:, :-1] = enc.word_start[:, 1:] | (np.arange(1, W)[None, :] >= enc.lengths[:, None])
    shared = _copy_scores(model, "pll", enc, specials, device, batch_tokens, last, segments)
    alone = _copy_scores(model, "pll", enc, specials, device, batch_tokens, ~last, segments)
    within = _copy_scores(model, "pll_word", enc, specials, device, batch_tokens, ~last, segments)
    return shared + alone, shared + within


@torch.no_grad()
def _copy_scores(
    model: nn.Module,
    form: str,
    enc: Encoded,
    specials: Specials,
    device: torch.device | str,
    batch_tokens: int,
    keep: np.ndarray | None = None,
    segments: bool = False,
) -> np.ndarray:
    """Summed log-probability over one copy per token (positions `keep`), each copy masking its token."""
    N = len(enc.lengths)
    total = torch.zeros(N, dtype=torch.float64)
    sent, pos = _copies(enc, keep)
    if not len(sent):
        return total.numpy()
    extra = {"pll": 0, "pll_word": 0, "masked_next": 1, "bart_mask": 1}.get(
        form, 2 if form == "sentinel_span" else 3
    )
    widths = enc.lengths[sent] + extra
    for lo, hi, width in _chunks(widths, batch_tokens):
        s, p = sent[lo:hi], pos[lo:hi]
        b = len(s)
        n = torch.from_numpy(enc.lengths[s])
        pt = torch.from_numpy(p)
        target = torch.from_numpy(enc.ids[s, p])
        col = torch.arange(width)[None, :]
        idx = torch.arange(b)
        if form in ("pll", "pll_word"):
            rows, _ = _masked_copies(enc, s, p, specials.mask, form == "pll_word")
            x = torch.full((b, width), specials.pad)
            x[:, : rows.size(1)] = rows[:, :width]
            valid = col < n[:, None]
            hidden = model.last_hidden(_batch(x.to(device), valid.to(device), "bidirectional", segments))  # type: ignore[operator]
            h = hidden[idx.to(device), pt.to(device)]
        elif form == "masked_next":
            rows, _ = _masked_copies(enc, s, p, specials.mask, False)
            x = torch.full((b, width), specials.pad)
            x[:, 0] = specials.eos
            x[:, 1 : 1 + rows.size(1)] = rows[:, : width - 1]
            valid = col <= n[:, None]
            hidden = model.last_hidden(_batch(x.to(device), valid.to(device), "prefix"))  # type: ignore[operator]
            h = hidden[idx.to(device), pt.to(device)]  # the token at row position p + 1, read at p
        elif form == "bart_mask":
            rows, _ = _masked_copies(enc, s, p, specials.mask, False)
            x = torch.full((b, width), specials.pad)
            x[:, : rows.size(1)] = rows[:, :width]
            x[idx, n] = specials.eos
            valid = col <= n[:, None]
            body = torch.from_numpy(enc.ids[s])
            dec = torch.full((b, width), specials.pad)
            dec[:, 1 : 1 + body.size(1)] = body[:, : width - 1]
            dec_valid = col < n[:, None]  # the start id and all but the last token are read
            hidden = _encdec_hidden(
                model, x.to(device), valid.to(device), dec.to(device), dec_valid.to(device)
            )
            h = hidden[idx.to(device), pt.to(device)]
        else:  # span, span_<mode>
            sentinel = specials.sentinel(0)
            rows, _ = _masked_copies(enc, s, p, sentinel, False)
            lead = 0 if form == "sentinel_span" else 1
            x = torch.full((b, width), specials.pad)
            if lead:
                x[:, 0] = int(getattr(specials, form.split("_", 1)[1]))
            x[:, lead : lead + rows.size(1)] = rows[:, : width - lead]
            x[idx, n + lead] = specials.eos
            valid = col <= (n + lead)[:, None]
            dec = torch.tensor([[specials.pad, sentinel]]).expand(b, 2)
            hidden = _encdec_hidden(
                model,
                x.to(device),
                valid.to(device),
                dec.to(device),
                torch.ones(b, 2, dtype=torch.bool, device=device),
            )
            h = hidden[:, 1]
        lp = _target_logprob(model, h, target.to(device)).cpu()
        total.index_add_(0, torch.from_numpy(s), lp)
    return total.numpy()


# --- the evaluation part --------------------------------------------------------------------------------

Scorer = Callable[[Encoded], np.ndarray]


def model_scorer(
    model: nn.Module,
    form: str,
    specials: Specials,
    device: torch.device | str,
    batch_tokens: int = 0,  # 0: batch_tokens_for(device)
    segments: bool = False,
) -> Scorer:
    return lambda enc: score_sentences(model, form, enc, specials, device, batch_tokens, segments)


def evaluate_pairs(scorer: Scorer, good: Encoded, bad: Encoded, pairs: Pairs) -> dict[str, Any]:
    """The summary (`summarize`) of one scorer over the pairs."""
    right, tie = compare_scores(scorer(good), scorer(bad))
    return summarize(right, tie, pairs)


def flat_metrics(summary: dict[str, Any], prefix: str = "blimp") -> dict[str, float]:
    """`blimp_accuracy`, `_lo`, `_hi`, `_tie_rate` (prefix e.g. `blimp_pll`, `blimp_random_init`)."""
    cell = summary["all"]
    return {
        f"{prefix}_accuracy": cell["accuracy"],
        f"{prefix}_accuracy_lo": cell["lo"],
        f"{prefix}_accuracy_hi": cell["hi"],
        f"{prefix}_tie_rate": cell["tie_rate"],
    }


def read_paper_rows(path: Path) -> dict[str, dict[str, float]]:
    """The BLiMP paper's accuracy per paradigm (`raw_results/summary/models_summary.jsonl`: one row per
    UID with a number per model), as {UID: {model: accuracy}}."""
    rows: dict[str, dict[str, float]] = {}
    for n, line in enumerate(_lines(Path(path)), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"--blimp-paper: {path} line {n} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("UID"), str):
            raise UserError(f"--blimp-paper: {path} line {n} has no string field 'UID'")
        rows[row["UID"]] = {
            k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    if not rows:
        raise UserError(f"--blimp-paper: {path} holds no rows")
    return rows


def paper_reference(rows: dict[str, dict[str, float]], pairs: Pairs) -> dict[str, dict[str, float]]:
    """Each paper model's accuracy over the paradigms evaluated here, weighted by their pair counts:
    {"all": {model: acc}, term: {model: acc}, ...} (paradigms the paper has no row for are left out)."""
    uids, counts = np.unique(np.asarray(pairs.uid), return_counts=True)
    term_of = dict(zip(pairs.uid, pairs.term, strict=True))
    groups: dict[str, dict[str, list[float]]] = {}
    for uid, count in zip(uids.tolist(), counts.tolist(), strict=True):
        if uid not in rows:
            continue
        for group in ("all", term_of[uid]):
            for model, acc in rows[uid].items():
                g = groups.setdefault(group, {}).setdefault(model, [0.0, 0.0])
                g[0] += acc * count
                g[1] += count
    return {g: {m: s / w for m, (s, w) in models.items()} for g, models in groups.items()}


# --- the n-gram baseline --------------------------------------------------------------------------------


class NGram:
    """An interpolated absolute-discounting n-gram model (Ney, Essen & Kneser 1994; discount 0.75) counted
    over token documents with numpy (keys hashed to int64, counts by `np.unique`, look-ups by
    `np.searchsorted`), the BLiMP paper's 5-gram baseline in kind. Documents are read behind one EOS, as
    the neural forms read a sentence. A library was not used: KenLM builds its models with a compiled
    binary, and NLTK's `lm` counts in Python, far too slowly for millions of tokens."""

    def __init__(self, documents: Sequence[np.ndarray], vocab_size: int, order: int, context: int) -> None:
        if order < 1 or vocab_size**order >= 2**62:
            raise UserError(f"n-gram order {order} is out of range for a vocabulary of {vocab_size}")
        self.order, self.V, self.context, self.d = order, vocab_size, context, 0.75
        flat, _ = self._layout(documents)
        scored = np.flatnonzero(self._body)
        tokens = np.bincount(flat[scored], minlength=vocab_size).astype(np.float64)
        self.p1 = (tokens + 1.0) / (tokens.sum() + vocab_size)
        self.tables: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for k in range(1, order):  # contexts of k tokens
            keys, _ = self._keys(flat, scored, k)
            full, counts = np.unique(keys, return_counts=True)
            cfull = full // self.V
            ctx_keys, first = np.unique(cfull, return_index=True)
            ctx_total = np.add.reduceat(counts, first).astype(np.float64)
            ctx_types = np.diff(np.append(first, len(full))).astype(np.float64)
            self.tables.append((full, counts.astype(np.float64), ctx_keys, ctx_total, ctx_types))

    def _layout(self, documents: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """A flat array `EOS*(n-1) doc_0 EOS*(n-1) doc_1 ...` and the first scored index of each document."""
        pad = self.order - 1
        lengths = np.array([len(d) for d in documents], dtype=np.int64)
        flat = np.full(int((lengths + pad).sum()), self.context, dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(lengths + pad)[:-1])).astype(np.int64) + pad
        body = np.ones(len(flat), dtype=bool)
        gap = (starts[:, None] - 1 - np.arange(pad)[None, :]).reshape(-1)
        body[gap] = False
        if len(documents):
            flat[body] = np.concatenate([np.asarray(d, dtype=np.int64) for d in documents])
        self._body = body
        return flat, starts

    def _keys(self, flat: np.ndarray, at: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys of the (k context + 1)-grams ending at `at`, and of their contexts."""
        ctx = np.zeros(len(at), dtype=np.int64)
        for j in range(k, 0, -1):
            ctx = ctx * self.V + flat[at - j]
        return ctx * self.V + flat[at], ctx

    def logprob(self, flat: np.ndarray, at: np.ndarray) -> np.ndarray:
        """log p of the tokens at `at` of `flat` given their n - 1 predecessors (natural log)."""
        p = self.p1[flat[at]]
        for k, (full, counts, ctx_keys, ctx_total, ctx_types) in enumerate(self.tables, 1):
            keys, ctx = self._keys(flat, at, k)
            ci = np.searchsorted(ctx_keys, ctx).clip(max=max(len(ctx_keys) - 1, 0))
            seen = ctx_keys[ci] == ctx if len(ctx_keys) else np.zeros(len(at), dtype=bool)
            fi = np.searchsorted(full, keys).clip(max=max(len(full) - 1, 0))
            c = np.where(full[fi] == keys, counts[fi], 0.0) if len(full) else np.zeros(len(at))
            total = np.where(seen, ctx_total[ci], 1.0)
            types = np.where(seen, ctx_types[ci], 0.0)
            mixed = np.maximum(c - self.d, 0.0) / total + self.d * types / total * p
            p = np.where(seen, mixed, p)
        return np.log(p)

    def score(self, enc: Encoded) -> np.ndarray:
        """(N,) summed log-probability of each sentence behind the context token."""
        docs = [enc.ids[i, : enc.lengths[i]] for i in range(len(enc.lengths))]
        flat, _ = self._layout(docs)
        at = np.flatnonzero(self._body)
        lp = self.logprob(flat, at)
        owner = np.repeat(np.arange(len(docs)), enc.lengths)
        return np.bincount(owner, weights=lp, minlength=len(docs))
