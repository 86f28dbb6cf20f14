"""Properties every objective must have, run over every registered objective and each of its model kinds.

The reference's cross-cutting checklist (section 15) where it can be stated without knowing the objective:
seeded per row (15.6), loss masks never on padding or on tokens that are not targets (15.3), special
tokens never corrupted and never drawn as random replacements (15.4), attention and positions inside
documents, config files that mirror the code, and graceful handling of rows that are too short.
An objective whose module is not importable is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import MODEL_KINDS, Batch, ModelOutput, positions_of
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective
from objtrain.objectives.registry import (
    OBJECTIVES,
    build_objective,
    config_dir,
    objective_class,
    objective_config,
)
from objtrain.specials import N_FIXED, Specials
from objtrain.views import corrupt as shown

MODEL_LENGTH = 96
N_ROWS = 8
DETERMINISTIC = {"clm", "mtp", "contrastive"}  # no randomness: a different seed gives the same batch
VIEWS = {"contrastive": 2}  # batch rows per raw row (two views of each row, rows 2i and 2i+1)
PAIR_TARGETS = {"contrastive"}  # the loss counts pairs of rows (Batch.target_count), not labelled tokens


def _cases(kinds: tuple[str, ...] = MODEL_KINDS) -> list[Any]:
    cases = []
    for name in OBJECTIVES:
        try:
            cls = objective_class(name)
        except Exception as exc:  # not written yet, or broken: reported as a skip with the reason
            reason = f"{name}: module not importable ({type(exc).__name__}: {exc})".splitlines()[0]
            cases.append(
                pytest.param((name, None), id=f"{name}-missing", marks=pytest.mark.skip(reason=reason))
            )
            continue
        for kind in cls.model_kinds:
            if kind in kinds and trains(name, kind):
                cases.append(pytest.param((name, kind), id=f"{name}-{kind}"))
    return cases


def trains(name: str, kind: str) -> bool:
    """False when the objective's defaults rule the kind out (a mixture trains only its components' kinds)."""
    try:
        build_objective(name, Specials(), model_kind=kind)  # type: ignore[arg-type]
    except UserError as exc:
        return "cannot train" not in str(exc)
    return True


CASES = _cases()
ENCDEC_CASES = _cases(("encdec",))


@pytest.fixture(scope="module")
def documents(tokenizer: Tokenizer, stdlib_texts: list[str]) -> list[list[int]]:
    """Documents of very different lengths (7 to ~700 tokens), cut from real Python source."""
    ids = [t for text in stdlib_texts for t in tokenizer.encode(text)]
    lengths = [60, 150, 7, 300, 90, 700, 25, 40, 200, 12, 120, 500]
    docs, at = [], 0
    for i in range(60):
        n = lengths[i % len(lengths)]
        docs.append(ids[at : at + n])
        at += n
    return docs


@cache
def _objective(name: str, kind: str, tokenizer: Tokenizer) -> Objective:
    return build_objective(name, tokenizer.specials, tokenizer=tokenizer, model_kind=kind)  # type: ignore[arg-type]


def objective_for(name: str, kind: str, tokenizer: Tokenizer) -> Objective:
    try:
        return _objective(name, kind, tokenizer)
    except UserError as exc:  # e.g. a mixture whose default components do not share this kind
        pytest.skip(f"{name} cannot be configured for {kind} with its defaults: {exc}")


def make_rows(objective: Objective, documents: list[list[int]], specials: Specials) -> shown.RawRows:
    """8 packed rows of the objective's raw length; the last one half padding."""
    L = objective.raw_length(MODEL_LENGTH)
    tokens, docs = shown.rows_from_documents(documents, L, N_ROWS, specials)
    tokens, docs = tokens.clone(), docs.clone()
    tokens[-1, L // 2 :] = specials.pad
    docs[-1, L // 2 :] = -1
    return shown.RawRows(tokens, docs, torch.arange(N_ROWS) + 100, specials, None, "test")


def apply(
    objective: Objective, raw: shown.RawRows, seed: int = 0, rows: slice | Tensor | None = None
) -> Batch:
    sel = slice(None) if rows is None else rows
    return objective(raw.tokens[sel], raw.document_ids[sel], raw.row_index[sel], seed)


@pytest.fixture
def case(request: pytest.FixtureRequest, tokenizer: Tokenizer, documents: list[list[int]]) -> tuple:
    name, kind = request.param
    objective = objective_for(name, kind, tokenizer)
    raw = make_rows(objective, documents, tokenizer.specials)
    return objective, raw, apply(objective, raw)


def parametrize_cases(func: Any) -> Any:
    return pytest.mark.parametrize("case", CASES, indirect=True)(func)


# ---------------------------------------------------------------------------------------------------
# Helpers


def batches_equal(a: Batch, b: Batch) -> bool:
    ta, tb = a.tensors(), b.tensors()
    return (
        a.attention == b.attention and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    )


def trimmed_row(batch: Batch, b: int) -> dict[str, Tensor]:
    """Row b without its padding: what must not depend on the batch the row was read in."""
    real = batch.document_ids[b] >= 0
    out = {
        "input_ids": batch.input_ids[b][real],
        "positions": batch.positions[b][real],
        "document_ids": batch.document_ids[b][real],
    }
    for name in ("prefix_mask", "segment_ids"):
        value = getattr(batch, name)
        if value is not None:
            out[name] = value[b][real]
    if batch.is_encdec:
        dec = batch.decoder_document_ids[b] >= 0  # type: ignore[index]
        out["labels"] = batch.labels[b][dec]
        out["decoder_input_ids"] = batch.decoder_input_ids[b][dec]  # type: ignore[index]
        out["decoder_positions"] = batch.decoder_positions[b][dec]  # type: ignore[index]
        out["decoder_document_ids"] = batch.decoder_document_ids[b][dec]  # type: ignore[index]
    else:
        out["labels"] = batch.labels[b][real]
    if batch.mtp_labels is not None:
        out["mtp_labels"] = batch.mtp_labels[b][:, real]
    if batch.seq_labels is not None:
        out["seq_labels"] = batch.seq_labels[b]
    return out


def assert_rows_equal(a: Batch, i: int, b: Batch, j: int) -> None:
    ra, rb = trimmed_row(a, i), trimmed_row(b, j)
    assert ra.keys() == rb.keys()
    for key in ra:
        assert torch.equal(ra[key], rb[key]), f"row differs in {key}"


def label_document_ids(batch: Batch) -> Tensor:
    """Document ids of the positions the labels belong to."""
    return batch.decoder_document_ids if batch.is_encdec else batch.document_ids  # type: ignore[return-value]


def is_run_per_value(ids: Tensor) -> bool:
    """Every value of the 1-D `ids` forms one contiguous run."""
    runs = torch.unique_consecutive(ids)
    return runs.numel() == torch.unique(ids).numel()


# ---------------------------------------------------------------------------------------------------
# 15.6: seeded per row


@parametrize_cases
def test_same_seed_same_batch_other_seed_differs(case: tuple) -> None:
    objective, raw, batch = case
    again = apply(objective, raw, seed=0)
    assert batches_equal(batch, again)
    other = apply(objective, raw, seed=1)
    if objective.name in DETERMINISTIC:
        assert batches_equal(batch, other)
    else:
        assert not batches_equal(batch, other), "a different seed gave the identical batch"


@parametrize_cases
def test_rows_do_not_depend_on_their_batch(case: tuple) -> None:
    """Rows 0..7 in one batch equal batches of 3 + 5, and the batch order does not matter either."""
    objective, raw, batch = case
    v = VIEWS.get(objective.name, 1)
    first, second = apply(objective, raw, rows=slice(0, 3)), apply(objective, raw, rows=slice(3, N_ROWS))
    for b in range(N_ROWS * v):
        part, i = (first, b) if b < 3 * v else (second, b - 3 * v)
        assert_rows_equal(batch, b, part, i)
    order = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4])
    shuffled = apply(objective, raw, rows=order)
    for i, b in enumerate(order.tolist()):
        for k in range(v):
            assert_rows_equal(batch, b * v + k, shuffled, i * v + k)


@parametrize_cases
def test_randomness_is_keyed_by_global_row_index(case: tuple) -> None:
    """The same row content under two different global indices is corrupted differently (stochastic)."""
    objective, raw, _ = case
    if objective.name in DETERMINISTIC:
        pytest.skip(f"{objective.name} draws no random numbers")
    tokens = raw.tokens[:1].repeat(6, 1)
    docs = raw.document_ids[:1].repeat(6, 1)
    batch = objective(tokens, docs, torch.tensor([3, 3, 10, 11, 12, 13]), 0)
    assert_rows_equal(batch, 0, batch, 1)
    rows = [trimmed_row(batch, b) for b in range(2, 6)]
    differs = any(any(not torch.equal(rows[0][k], r[k]) for k in r) for r in rows[1:])
    assert differs, "four different row indices gave the same corruption"


# ---------------------------------------------------------------------------------------------------
# 15.3 and 15.4: loss masks and special tokens


@parametrize_cases
def test_no_label_on_padding(case: tuple) -> None:
    objective, _, batch = case
    pad = label_document_ids(batch) < 0
    assert (batch.labels[pad] == IGNORE).all()
    if batch.mtp_labels is not None:
        assert (batch.mtp_labels.permute(0, 2, 1)[batch.document_ids < 0] == IGNORE).all()
    assert batch.n_targets > 0
    if objective.name in PAIR_TARGETS:  # one target per pair of views, none on tokens
        assert batch.n_targets == N_ROWS and (batch.labels == IGNORE).all()


@parametrize_cases
def test_labels_are_real_targets(case: tuple, specials: Specials) -> None:
    """Labels are never pad, unk, <mask>, <fim_pad>, cls/sep or a UL2 mode token, and every ordinary token
    that is a label comes from the batch's own text (no random token is ever a target)."""
    objective, raw, batch = case
    retokenises = getattr(objective.config, "level", None) == "char"
    labels = [batch.labels] + ([batch.mtp_labels] if batch.mtp_labels is not None else [])
    forbidden = torch.tensor(
        [
            *(specials.pad, specials.unk, specials.mask, specials.fim_pad, specials.cls, specials.sep),
            *(specials.nlu, specials.nlg, specials.s2s),
        ]
    )
    text = set(raw.tokens[raw.document_ids >= 0].tolist())
    for lab in labels:
        real = lab[lab != IGNORE]
        assert not torch.isin(real, forbidden).any(), (
            f"forbidden label {real[torch.isin(real, forbidden)][:5]}"
        )
        if retokenises:
            continue  # character-level FIM re-encodes its pieces: new tokens of the same text
        ordinary = set(real[real >= specials.first_ordinary].tolist())
        assert ordinary <= text, f"labels not from the text: {sorted(ordinary - text)[:5]}"


@parametrize_cases
def test_inputs_hold_no_stray_specials(case: tuple, specials: Specials) -> None:
    """Real input positions never hold pad or unk: random replacements exclude specials (15.4)."""
    _, _, batch = case
    real = batch.input_ids[batch.document_ids >= 0]
    assert not (real == specials.pad).any()
    assert not (real == specials.unk).any()
    if batch.is_encdec:
        dec = batch.decoder_input_ids[batch.decoder_document_ids >= 0]  # type: ignore[index]
        assert not (dec[1:] == specials.unk).any()


@pytest.mark.parametrize("case", _cases(("encoder",)), indirect=True)
def test_specials_never_masked_in_place(case: tuple, specials: Specials) -> None:
    """Where the input keeps the raw layout (masked LM style), special tokens stay and carry no label."""
    objective, raw, batch = case
    if (
        batch.is_encdec
        or batch.segment_ids is not None  # sentence pairs re-lay the row out
        or batch.input_ids.shape != raw.tokens.shape
    ):
        pytest.skip(f"{objective.name} does not keep the raw layout")
    special = specials.is_special(raw.tokens) & (raw.document_ids >= 0)
    assert special.any()
    assert torch.equal(batch.input_ids[special], raw.tokens[special])
    assert (batch.labels[special] == IGNORE).all()
    labelled = batch.labels != IGNORE
    assert torch.equal(batch.labels[labelled], raw.tokens[labelled]), "a label is not the original token"


@pytest.mark.parametrize("case", _cases(("decoder", "encdec")), indirect=True)
def test_labels_are_shifted_exactly_once(case: tuple) -> None:
    """Decoder-only: a label is the next input token of its document (never a double shift, section 1).
    Encoder-decoder: the decoder reads its labels shifted right by one inside each document."""
    objective, raw, batch = case
    if batch.is_encdec:
        dec_in, labels, docs = batch.decoder_input_ids, batch.labels, batch.decoder_document_ids
        assert dec_in is not None and docs is not None
        same = (docs[:, 1:] == docs[:, :-1]) & (docs[:, 1:] >= 0) & (labels[:, :-1] != IGNORE)
        assert same.any()
        assert torch.equal(dec_in[:, 1:][same], labels[:, :-1][same])
        return
    ids, docs = batch.input_ids, batch.document_ids
    if objective.name == "gpt_bert":  # masked next-token prediction: the next input may be <mask>
        ids = raw.tokens[:, : ids.size(1)]
    heads = [batch.labels] if batch.mtp_labels is None else list(batch.mtp_labels.unbind(1))
    for k, labels in enumerate(heads, start=1):
        same = (docs[:, k:] == docs[:, :-k]) & (labels[:, :-k] != IGNORE)
        assert same.any()
        assert torch.equal(labels[:, :-k][same], ids[:, k:][same]), f"head {k} is not offset {k}"


@parametrize_cases
def test_loss_is_finite_and_counts_targets(case: tuple, tokenizer: Tokenizer) -> None:
    objective, _, batch = case
    torch.manual_seed(0)
    V = tokenizer.vocab_size
    S = batch.labels.size(1)
    B = batch.input_ids.size(0)
    logits = torch.randn(B, S, V, requires_grad=True)
    mtp = None
    if batch.mtp_labels is not None:
        mtp = [torch.randn(B, S, V, requires_grad=True) for _ in range(batch.mtp_labels.size(1) - 1)]
    seq = torch.randn(B, S, 2, requires_grad=True) if batch.seq_labels is not None else None  # per position
    pooled = torch.randn(B, 16, requires_grad=True)
    out = objective.loss(ModelOutput(logits=logits, mtp_logits=mtp, seq_logits=seq, pooled=pooled), batch)
    assert torch.isfinite(out.loss_sum)
    assert int(out.n_targets) >= batch.n_targets > 0
    out.loss_sum.backward()
    if objective.name in PAIR_TARGETS:
        # The unit is the pair of views (rows 2i, 2i+1), not the token: one count per raw row, every
        # view's embedding gets a gradient, and no token carries a label.
        assert int(out.n_targets) == batch.n_targets == B // VIEWS[objective.name]
        assert pooled.grad is not None and (pooled.grad.abs().sum(1) > 0).all()
        assert (batch.labels == IGNORE).all()
        return
    assert logits.grad is not None
    ignored = batch.labels == IGNORE
    assert (logits.grad[ignored] == 0).all(), "an IGNORE position contributes to the loss"


@parametrize_cases
def test_sentinels_never_overflow_into_other_ids(case: tuple, documents: list[list[int]]) -> None:
    """15.2: with only 4 sentinels, a row needing more is refused with a UserError, never corrupted with
    ids counted down past the sentinel block into other specials (T5's silent overflow): the fixed ids
    below the sentinels that a batch uses are the same as with the full sentinel table."""
    objective, _, _ = case
    small = Specials(n_sentinels=4)
    try:
        few = build_objective(objective.name, small, model_kind=objective.model_kind)  # type: ignore[arg-type]
        full = build_objective(objective.name, Specials(), model_kind=objective.model_kind)  # type: ignore[arg-type]
    except UserError as exc:
        pytest.skip(f"{objective.name} cannot be built without its tokenizer: {exc}")
    stream = torch.tensor([t for d in documents for t in d])

    def fixed_ids(b: Batch) -> set[int]:
        values = torch.cat([t.reshape(-1) for t in (b.input_ids, b.labels)])
        return set(values[(values >= 0) & (values < N_FIXED)].tolist())

    for m in (256, 24):
        try:
            L = few.raw_length(m)
            tokens = stream[: 4 * L].view(4, L)
            docs, index = torch.zeros_like(tokens), torch.arange(4)
            batch = few(tokens, docs, index, 0)
        except UserError as exc:
            assert "sentinel" in str(exc), f"refused for another reason: {exc}"
            continue
        assert fixed_ids(batch) <= fixed_ids(full(tokens, docs, index, 0))


# ---------------------------------------------------------------------------------------------------
# Attention and positions


@parametrize_cases
def test_attention_and_positions_stay_inside_documents(case: tuple) -> None:
    objective, _, batch = case
    docs = batch.document_ids
    mask = shown.attention_mask(batch)
    B, T = docs.shape
    assert mask.shape == (B, T, T)
    assert mask.any(-1).all(), "a position attends to nothing"
    cross = mask & (docs[:, :, None] != docs[:, None, :])
    assert not cross.any()
    real = docs >= 0
    assert not (mask & real[:, :, None] & ~real[:, None, :]).any(), "a real token sees padding"
    assert torch.equal(batch.positions[real], positions_of(docs)[real])
    for b in range(B):
        assert is_run_per_value(docs[b]), "a document is split into several runs"
    if batch.attention == "prefix":
        assert batch.prefix_mask is not None
        pm = batch.prefix_mask & real
        # the prefix of a document is a leading run: a prefix position's predecessor in its document is too
        inner = (docs[:, 1:] == docs[:, :-1]) & pm[:, 1:]
        assert pm[:, :-1][inner].all()
    try:
        from objtrain.models.attention import self_attention_mask
    except ImportError:
        return
    model_mask = self_attention_mask(docs, batch.attention, batch.prefix_mask)[:, 0]
    assert torch.equal(model_mask, mask), f"{objective.name}: the model builds a different mask"


@pytest.mark.parametrize("case", ENCDEC_CASES, indirect=True)
def test_decoder_stays_inside_encoder_documents(case: tuple) -> None:
    _, _, batch = case
    assert batch.is_encdec
    dec_docs, dec_pos = batch.decoder_document_ids, batch.decoder_positions
    assert dec_docs is not None and dec_pos is not None
    real = dec_docs >= 0
    assert torch.equal(dec_pos[real], positions_of(dec_docs)[real])
    cross = shown.cross_attention_mask(batch)
    assert cross[real].any(-1).all(), "a decoder document has no encoder tokens to attend to"


# ---------------------------------------------------------------------------------------------------
# Lengths


@parametrize_cases
def test_raw_length_fills_but_fits_the_model_length(
    case: tuple, documents: list[list[int]], specials: Specials
) -> None:
    """Single-document rows of `raw_length(m)` tokens give batches no longer than m."""
    objective, _, _ = case
    stream = torch.tensor([t for d in documents for t in d])
    for m in (16, 64, 256):
        L = objective.raw_length(m)
        assert L >= 1
        tokens = stream[: 4 * L].view(4, L)
        batch = objective(tokens, torch.zeros_like(tokens), torch.arange(4), 0)
        assert batch.input_ids.size(1) <= m
        if batch.is_encdec:  # BART's decoder reconstructs the original, longer than its noised input
            assert batch.labels.size(1) <= (objective.widths(L)[1] if objective.name == "bart" else m)


# Token ids >= 50 stand for ordinary tokens (offset by `first_ordinary`); 3 is EOS, 0 pad.
SHORT_ROWS = {
    "one token": ([[50]], [[0]]),
    "two tokens": ([[50, 3]], [[0, 0]]),
    "one-token documents": ([[50, 3, 51, 3, 52, 3]], [[0, 0, 1, 1, 2, 2]]),
    "empty documents": ([[3, 3, 3, 60, 61, 3]], [[0, 1, 2, 3, 3, 3]]),
    "all padding": ([[0, 0, 0, 0]], [[-1, -1, -1, -1]]),
    "tiny rows": ([[300, 301, 302], [303, 304, 3]], [[0, 0, 0], [0, 0, 0]]),
}


@parametrize_cases
@pytest.mark.parametrize("short", list(SHORT_ROWS))
def test_short_rows_give_a_batch_or_a_user_error(case: tuple, short: str, specials: Specials) -> None:
    objective, _, _ = case
    tokens, docs = (torch.tensor(x) for x in SHORT_ROWS[short])
    tokens = torch.where(tokens >= 50, tokens + specials.first_ordinary, tokens)  # ordinary ids
    try:
        batch = objective(tokens, docs, torch.arange(tokens.size(0)), 0)
    except UserError:
        return
    assert isinstance(batch, Batch)
    assert batch.input_ids.size(0) == tokens.size(0) * VIEWS.get(objective.name, 1)
    assert batch.labels.dim() == 2
    pad = label_document_ids(batch) < 0
    assert (batch.labels[pad] == IGNORE).all()


# ---------------------------------------------------------------------------------------------------
# Configuration files


YAMLS = sorted((config_dir() / "objectives").glob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_yaml_mirrors_the_config_defaults(path: Path) -> None:
    name = path.stem
    assert name in OBJECTIVES, f"{path.name} has no registry entry"
    try:
        cls = objective_class(name)
    except Exception as exc:
        pytest.skip(f"{name}: module not importable ({type(exc).__name__})")
    assert dataclasses.is_dataclass(cls.Config)
    assert objective_config(name) == cls.Config()


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_objective_has_a_yaml(name: str) -> None:
    try:
        objective_class(name)
    except Exception as exc:
        pytest.skip(f"{name}: module not importable ({type(exc).__name__})")
    assert (config_dir() / "objectives" / f"{name}.yaml").is_file()


# ---------------------------------------------------------------------------------------------------
# Raw token usage: what an objective reports is what its batch holds

USAGE_CASES = [
    ("clm", "decoder", {}),
    ("clm", "decoder", {"cross_document_targets": True}),
    ("mlm", "encoder", {"vocab_size": N_FIXED + 2000}),
    ("fim", "decoder", {"level": "token", "fim_rate": 1.0}),
    ("fim", "decoder", {"level": "token", "fim_rate": 0.5}),
    ("prefix_lm", "decoder", {}),
    ("prefix_lm", "encdec", {}),
    ("contrastive", "encoder", {}),
    ("contrastive", "encoder", {"views": "crop", "crop_min": 0.3, "deletion_rate": 0.2}),
    ("mixture", "decoder", {}),
    ("mixture", "encdec", {}),
]


def _distinct_rows(length: int, specials: Specials) -> tuple[Tensor, Tensor]:
    """6 rows of distinct ordinary tokens (a raw position is known by its value), several documents per
    row (boundaries by id only, no EOS to repeat a value), the last two rows ending in padding."""
    gen = torch.Generator().manual_seed(4)
    rows = (
        torch.stack([torch.randperm(2000, generator=gen)[:length] for _ in range(6)])
        + specials.first_ordinary
    )
    cuts = torch.rand(6, length, generator=gen) < 0.06
    cuts[:, 0] = False
    docs = cuts.long().cumsum(1)
    docs[4:, length * 2 // 3 :] = -1
    rows = torch.where(docs >= 0, rows, specials.pad)
    return rows, docs


@pytest.mark.parametrize(("name", "kind", "overrides"), USAGE_CASES, ids=lambda v: str(v) if v else "default")
def test_reported_raw_usage_is_what_the_batch_holds(name: str, kind: str, overrides: dict) -> None:
    """`raw_tokens_fed` counts the real raw positions, `raw_tokens_unused` those whose token is in no input
    and no target of the batch (counted here by value: every raw token of a row is distinct)."""
    specials = Specials()
    objective = build_objective(name, specials, model_kind=kind, overrides=overrides)  # type: ignore[arg-type]
    rows, docs = _distinct_rows(objective.raw_length(MODEL_LENGTH), specials)
    batch = objective(rows, docs, torch.arange(6) + 7, 0)
    views = VIEWS.get(name, 1)
    held = [batch.input_ids, batch.labels]
    if batch.decoder_input_ids is not None:
        held.append(batch.decoder_input_ids)
    used = 0
    for r in range(rows.size(0)):
        values = set().union(*(set(t[r * views : (r + 1) * views].reshape(-1).tolist()) for t in held))
        used += sum(int(v) in values for v in rows[r][docs[r] >= 0].tolist())
    fed = int((docs >= 0).sum())
    assert batch.stats["raw_tokens_fed"] == fed
    assert batch.stats["raw_tokens_unused"] == fed - used
