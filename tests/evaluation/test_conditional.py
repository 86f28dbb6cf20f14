"""conditional_bpb: the second half of held-out documents given the first, every model in its own form."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation import conditional
from objtrain.models.zoo import build_model, model_config
from objtrain.training.accounting import token_bytes

Result = tuple[int, str, str]


def _sharp(kind: str, tokenizer: Tokenizer) -> torch.nn.Module:
    """A debug model whose attention is far from uniform (at init it nearly is)."""
    torch.manual_seed(0)
    model = build_model(model_config(kind, "debug", vocab_size=tokenizer.vocab_size)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("qkv.weight") or name.endswith("q.weight") or name.endswith("kv.weight"):
                param.mul_(6.0)
    return model


def _docs(stdlib_texts: list[str], tokenizer: Tokenizer, n: int = 12) -> list[np.ndarray]:
    paragraphs = [p for text in stdlib_texts for p in text.split("\n\n") if len(p) > 80][:n]
    return [np.array(tokenizer.encode(p), dtype=np.int64) for p in paragraphs]


def test_halves_are_whole_words_in_the_middle_and_fixed_by_the_seed(
    stdlib_texts: list[str], tokenizer: Tokenizer
) -> None:
    docs = _docs(stdlib_texts, tokenizer, 40)
    begins, ends = tokenizer.word_boundary_tables
    halves = conditional.split_documents(docs, tokenizer, 7, 60, 40)
    assert len(halves) == len(docs)
    table = token_bytes(tokenizer).numpy()
    for (a, b), doc in zip(halves, docs, strict=True):
        n = len(a) + len(b)
        assert n == min(len(doc), 60) and 0.4 * n - 1 <= len(a) <= 0.6 * n + 1
        assert bool(begins[b[0]] or ends[a[-1]])  # the second half starts a word
        # the window is a stretch of the document
        whole = np.concatenate([a, b])
        assert any(np.array_equal(doc[i : i + n], whole) for i in range(len(doc) - n + 1))
        # bytes are the second half's text: the text of both halves less the first half's
        text, head = tokenizer.decode(whole.tolist()), tokenizer.decode(a.tolist())
        assert text.startswith(head)
        assert table[b].sum() == len(text.encode("utf-8")) - len(head.encode("utf-8"))
    again = conditional.split_documents(docs, tokenizer, 7, 60, 40)
    assert all(
        np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(halves, again, strict=True)
    )
    # a document's split does not depend on how many are scored; another seed splits elsewhere
    assert all(
        np.array_equal(x[0], y[0])
        for x, y in zip(conditional.split_documents(docs, tokenizer, 7, 60, 5), halves, strict=False)
    )
    other = conditional.split_documents(docs, tokenizer, 8, 60, 40)
    assert any(len(x[0]) != len(y[0]) for x, y in zip(halves, other, strict=True))
    # too short to split: skipped
    assert conditional.split_documents([np.arange(20, 25)], tokenizer, 0, 60, 5) == []


@pytest.mark.parametrize(
    ("kind", "training", "mode"),
    [
        ("decoder", {"objective": "clm"}, "causal"),
        ("decoder", {"objective": "mtp"}, "causal"),
        ("decoder", {"objective": "prefix_lm"}, "prefix"),
        (
            "decoder",
            {"objective": "mixture", "objective_config": {"components": [{"objective": "prefix_lm"}]}},
            "prefix",
        ),
        ("decoder", {"objective": "fim", "fim_mode": "spm"}, "fim-spm"),
        ("decoder", {"objective": "fim"}, "fim-psm"),
        ("decoder", {"objective": "fim", "objective_config": {"fim_rate": 0}}, "causal"),
        ("decoder", {"objective": "span"}, "sentinel"),
        ("decoder", {"objective": "ul2"}, "prefix"),
        ("encdec", {"objective": "span"}, "sentinel"),
        ("encdec", {"objective": "prefix_lm"}, "encoder-input"),
        ("encdec", {"objective": "ul2"}, "encoder-input"),
        ("encdec", {"objective": "ul2", "objective_config": {"denoisers": [{"kind": "R"}]}}, "sentinel"),
        ("encdec", {"objective": "bart"}, "bart"),
        ("encdec", {"objective": "mixture"}, "encoder-input"),  # the default: span and prefix LM
        (
            "encdec",
            {"objective": "mixture", "objective_config": {"components": [{"objective": "span"}]}},
            "sentinel",
        ),
        ("encoder", {"objective": "mlm"}, "none"),
    ],
)
def test_each_model_is_scored_in_its_own_form(kind: str, training: dict, mode: str) -> None:
    assert conditional.conditional_mode(kind, training) == mode


@pytest.mark.parametrize(
    "mode", ["causal", "prefix", "fim-psm", "fim-spm", "encoder-input", "bart", "sentinel", "sentinel-encdec"]
)
def test_every_layout_scores_exactly_the_second_half(mode: str, tokenizer: Tokenizer) -> None:
    first, second = [100, 101, 102], [200, 201, 202, 203]
    seq = conditional.sequence(mode, first, second, tokenizer.specials, [13], 0)
    assert seq.ids[seq.first + 1 : seq.last + 1] == second
    if seq.inputs is not None:  # the encoder reads the first half
        assert seq.inputs[-1] == tokenizer.specials.eos and seq.inputs[1 : 1 + len(first)] in (
            first,
            [101, 102, tokenizer.specials.mask],
        )
    if mode == "prefix":  # the mode token and the first half are the bidirectional prefix
        assert seq.ids[: seq.prefix_len] == [13, *first]


def _by_hand(
    model: torch.nn.Module, halves: list[tuple[np.ndarray, np.ndarray]], table: np.ndarray, prefix: bool
) -> float:
    nats, nbytes = 0.0, 0
    with torch.no_grad():
        for a, b in halves:
            ids = torch.tensor([[*a.tolist(), *b.tolist()]])
            L = ids.size(1)
            mask = torch.arange(L)[None] < len(a)
            batch = Batch(
                ids,
                ids,
                torch.arange(L)[None],
                torch.zeros_like(ids),
                "prefix" if prefix else "causal",
                prefix_mask=mask if prefix else None,
            )
            logp = F.log_softmax(model(batch).logits[0].double(), -1)
            nats -= float(sum(logp[len(a) - 1 + j, int(t)] for j, t in enumerate(b)))
            nbytes += int(table[b].sum())
    return nats / (math.log(2) * nbytes)


@pytest.mark.parametrize("objective", ["clm", "prefix_lm"])
def test_a_decoder_reads_on_and_a_prefix_lm_reads_its_prefix(
    objective: str, stdlib_texts: list[str], tokenizer: Tokenizer
) -> None:
    model = _sharp("decoder", tokenizer)
    docs, table = _docs(stdlib_texts, tokenizer), token_bytes(tokenizer)
    out = conditional.conditional_scores(
        model, "decoder", {"objective": objective}, tokenizer, docs, table, 3, 64, 10, units=True
    )
    halves = conditional.split_documents(docs, tokenizer, 3, 60, 10)
    assert out["conditional_docs"] == 10 and out["conditional_tokens"] == sum(len(b) for _, b in halves)
    expected = _by_hand(model, halves, table.numpy(), prefix=objective == "prefix_lm")
    assert out["conditional_bpb"] == pytest.approx(expected, rel=5e-7)
    # the two readings differ: the prefix LM's first half is read both ways
    other = _by_hand(model, halves, table.numpy(), prefix=objective != "prefix_lm")
    assert abs(other - expected) > 1e-4  # 50 times the tolerance above
    assert len(out["units"]["conditional_bpb"]["nats"]) == 10 and out["conditional_bpb_se"] > 0


def test_an_encoder_decoder_reads_the_first_half_in_its_encoder(
    stdlib_texts: list[str], tokenizer: Tokenizer
) -> None:
    model = _sharp("encdec", tokenizer)
    docs, table = _docs(stdlib_texts, tokenizer, 4), token_bytes(tokenizer)
    training = {"objective": "prefix_lm"}
    out = conditional.conditional_scores(model, "encdec", training, tokenizer, docs, table, 3, 64, 4)
    nats, nbytes = 0.0, 0
    with torch.no_grad():
        for a, b in conditional.split_documents(docs, tokenizer, 3, 60, 4):
            enc = torch.tensor([[*a.tolist(), tokenizer.specials.eos]])
            dec = torch.tensor([[tokenizer.specials.pad, *b.tolist()]])
            batch = Batch(
                enc, dec, torch.arange(enc.size(1))[None], torch.zeros_like(enc), "bidirectional",
                decoder_input_ids=dec, decoder_positions=torch.arange(dec.size(1))[None],
                decoder_document_ids=torch.zeros_like(dec),
            )  # fmt: skip
            logp = F.log_softmax(model(batch).logits[0].double(), -1)
            nats -= float(sum(logp[j, int(t)] for j, t in enumerate(b)))
            nbytes += int(table[b].sum())
    assert out["conditional_bpb"] == pytest.approx(nats / (math.log(2) * nbytes), rel=1e-5)
    assert out["conditional_mode"].startswith("first half as the encoder input")


def test_an_encoder_gets_no_score(tokenizer: Tokenizer) -> None:
    model = build_model(model_config("encoder", "debug", vocab_size=tokenizer.vocab_size))
    docs = [np.arange(10, 40)]
    assert (
        conditional.conditional_scores(
            model, "encoder", {"objective": "mlm"}, tokenizer, docs, token_bytes(tokenizer), 0, 64
        )
        == {}
    )


def test_eval_reports_it_for_each_generating_kind(
    objtrain_cli: Callable[..., Result],
    debug_checkpoint: Callable[..., Path],
    tmp_path: Path,
    stdlib_texts: list[str],
    tokenizer: Tokenizer,
) -> None:
    """A uniform model's conditional_bpb is log2(V) per scored token over the second halves' bytes."""
    data = tmp_path / "docs.txt"
    data.write_text(stdlib_texts[0][:3000], encoding="utf-8")
    skip = ("--skip", "lm,corrupted,infill,probe,samples", "--format", "json", "--data", data)
    for kind, objective in (("decoder", "clm"), ("decoder", "prefix_lm"), ("encdec", "span")):
        ckpt = debug_checkpoint(kind, {"objective": objective, "seq_len": 64}, zero=True)
        code, out, err = objtrain_cli("eval", ckpt, *skip)
        assert code == 0, err
        result = json.loads(out)
        expected = (
            math.log2(tokenizer.vocab_size) * result["conditional_tokens"] / result["conditional_bytes"]
        )
        assert (
            result["conditional_bpb"] == pytest.approx(expected, rel=1e-6) and result["conditional_docs"] > 10
        )
        assert result["conditional_bpb"] > 0 and "conditional_bpb" in json.loads(out)
    code, out, _ = objtrain_cli(
        "eval", debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 64}), *skip
    )
    assert code == 0 and "conditional_bpb" not in json.loads(out)
    code, out, _ = objtrain_cli(
        "eval", ckpt, *skip[:1], "lm,conditional,corrupted,infill,probe,samples", *skip[2:]
    )
    assert code == 0 and "conditional_bpb" not in json.loads(out)


def test_long_documents_give_disjoint_windows_taken_a_document_at_a_time(
    stdlib_texts: list[str], tokenizer: Tokenizer
) -> None:
    """A held-out split of a few books is scored on many windows, not one window a book."""
    books = [
        np.array(tokenizer.encode("\n".join(stdlib_texts[i::3])[:20000]), dtype=np.int64) for i in range(3)
    ]
    begins, ends = tokenizer.word_boundary_tables
    halves = conditional.split_documents(books, tokenizer, 7, 60, 10_000)
    assert len(halves) > 3 * 20  # every book gives tens of windows
    # a window of each book in turn, in book order; each window exactly 60 tokens, disjoint and in order
    # within its book (found past the end of the book's previous window)
    after = [0, 0, 0]
    for turn, (a, b) in enumerate(halves[:30]):
        whole = np.concatenate([a, b])
        k = turn % 3
        book = books[k]
        assert len(whole) == 60
        at = next(i for i in range(after[k], len(book) - 59) if np.array_equal(book[i : i + 60], whole))
        after[k] = at + 60
    # split at a word start wherever the middle fifth has one (a run of symbols may not)
    assert sum(bool(begins[b[0]] or ends[a[-1]]) for a, b in halves) >= 0.9 * len(halves)
    # the limit keeps the first windows in turn; the same seed, the same windows
    few = conditional.split_documents(books, tokenizer, 7, 60, 5)
    assert all(np.array_equal(x[1], y[1]) for x, y in zip(few, halves[:5], strict=True)) and len(few) == 5
