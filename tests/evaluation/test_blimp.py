"""Minimal pairs (objtrain/evaluation/blimp.py): accuracy with ties wrong, each kind's batched scorer against
a slow loop written here, the n-gram baseline, and the CLI's refusals."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.evaluation import blimp
from objtrain.models.zoo import build_model, model_config
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials

TERMS = ("subject_verb_agreement", "island_effects")


def _pairs_rows(n: int = 12) -> list[dict]:
    rows = []
    for i in range(n):
        term = TERMS[i % 2]
        rows.append(
            {
                "sentence_good": f"The cats {i} sleep.",
                "sentence_bad": f"The cats {i} sleeps quietly now.",
                "field": "syntax",
                "linguistics_term": term,
                "UID": f"{term}_{i % 3}",
                "pairID": str(i),
            }
        )
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_read_pairs_reads_a_folder_and_a_gzip_file(tmp_path: Path) -> None:
    rows = _pairs_rows()
    (tmp_path / "d").mkdir()
    _write(tmp_path / "d" / "a.jsonl", rows[:5])
    _write(tmp_path / "d" / "b.jsonl", rows[5:])
    folder = blimp.read_pairs(tmp_path / "d")
    one = blimp.read_pairs(_write(tmp_path / "all.jsonl.gz", rows))
    assert folder.good == one.good == [r["sentence_good"] for r in rows]
    assert one.uid[:2] == ["subject_verb_agreement_0", "island_effects_1"]


def test_per_paradigm_keeps_the_first_pairs_of_each_paradigm(tmp_path: Path) -> None:
    rows = _pairs_rows()  # 12 pairs over 6 paradigms, two each
    path = _write(tmp_path / "all.jsonl", rows)
    one = blimp.read_pairs(path, per_paradigm=1)
    firsts = {}
    for r in rows:
        firsts.setdefault(r["UID"], r["sentence_good"])
    assert one.good == list(firsts.values()) and len(set(one.uid)) == len(one.uid) == 6
    assert "first 1 pairs of each paradigm" in one.source
    assert blimp.read_pairs(path, per_paradigm=5).good == blimp.read_pairs(path).good
    with pytest.raises(UserError, match="at least 0"):
        blimp.read_pairs(path, per_paradigm=-1)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"sentence_good": "a"\n', "line 1 is not JSON"),
        (
            '{"sentence_good": "a", "sentence_bad": "b", "UID": "u"}\n',
            "has no string field 'linguistics_term'",
        ),
        ("[1, 2]\n", "is not a JSON object"),
        ("\n", "holds no pairs"),
    ],
)
def test_bad_pair_files_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=message):
        blimp.read_pairs(path)
    with pytest.raises(UserError, match="not found"):
        blimp.read_pairs(tmp_path / "missing.jsonl")


def _encoded_pairs(rows: list[dict]) -> tuple[blimp.Pairs, blimp.Encoded, blimp.Encoded]:
    pairs = blimp.Pairs(
        [r["sentence_good"] for r in rows],
        [r["sentence_bad"] for r in rows],
        [r["UID"] for r in rows],
        [r["linguistics_term"] for r in rows],
        "made up",
    )
    # a made-up "tokenizer": one id per character
    good = blimp.encode_sentences([[20 + ord(c) % 50 for c in s] for s in pairs.good])
    bad = blimp.encode_sentences([[20 + ord(c) % 50 for c in s] for s in pairs.bad])
    return pairs, good, bad


def test_a_scorer_that_prefers_the_good_sentence_scores_one() -> None:
    pairs, good, bad = _encoded_pairs(_pairs_rows())
    # shorter is better here, and every good sentence is the shorter one
    summary = blimp.evaluate_pairs(lambda e: -e.lengths.astype(np.float64), good, bad, pairs)
    assert summary["all"]["accuracy"] == 1.0 and summary["all"]["tie_rate"] == 0.0
    assert set(summary["by_term"]) == set(TERMS)
    assert all(c["accuracy"] == 1.0 for c in summary["by_paradigm"].values())
    assert summary["all"]["lo"] < 1.0 == summary["all"]["hi"]
    backwards = blimp.evaluate_pairs(lambda e: e.lengths.astype(np.float64), good, bad, pairs)
    assert backwards["all"]["accuracy"] == 0.0 and backwards["all"]["tie_rate"] == 0.0


def test_a_constant_scorer_scores_zero_with_ties_one() -> None:
    pairs, good, bad = _encoded_pairs(_pairs_rows())
    summary = blimp.evaluate_pairs(lambda e: np.zeros(len(e.lengths)), good, bad, pairs)
    assert summary["all"]["accuracy"] == 0.0
    assert summary["all"]["tie_rate"] == 1.0
    assert all(c["tie_rate"] == 1.0 and c["accuracy"] == 0.0 for c in summary["by_term"].values())


def test_wilson_interval_matches_its_formula() -> None:
    lo, hi = blimp.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert blimp.wilson(0, 0) == (0.0, 1.0)


# --- each kind's batched scorer against a slow loop ---------------------------------------------------

V = 300
SP = Specials()


def _sentences() -> tuple[list[list[int]], list[list[bool]]]:
    g = torch.Generator().manual_seed(0)
    lo = SP.first_ordinary
    sents, starts = [], []
    for n in (1, 2, 5, 7, 7, 11, 3):
        sents.append(torch.randint(lo, V, (n,), generator=g).tolist())
        ws = (torch.rand(n, generator=g) < 0.5).tolist()
        ws[0] = True
        starts.append(ws)
    return sents, starts


def _model(kind: str) -> nn.Module:
    torch.manual_seed(1)
    return build_model(model_config(kind, "debug", vocab_size=V)).eval()


def _lp(logits: torch.Tensor, token: int) -> float:
    return float(logits.double().log_softmax(-1)[token])


def _pos(n: int) -> torch.Tensor:
    return torch.arange(n)[None, :]


def _enc_dec(model: nn.Module, enc: list[int], dec: list[int]) -> torch.Tensor:
    e, d = torch.tensor([enc]), torch.tensor([dec])
    batch = Batch(e, d, _pos(len(enc)), torch.zeros_like(e), "bidirectional", decoder_input_ids=d,
                  decoder_positions=_pos(len(dec)), decoder_document_ids=torch.zeros_like(d))  # fmt: skip
    return model(batch).logits[0]


@torch.no_grad()
def _reference(model: nn.Module, form: str, t: list[int], word_start: list[bool]) -> float:
    n, total = len(t), 0.0
    if form == "causal":
        x = torch.tensor([[SP.eos, *t]])
        logits = model(Batch(x, x, _pos(n + 1), torch.zeros_like(x), "causal")).logits[0]
        return sum(_lp(logits[j], t[j]) for j in range(n))
    if form == "encdec_lm":
        logits = _enc_dec(model, [SP.eos], [SP.pad, *t[:-1]])
        return sum(_lp(logits[j], t[j]) for j in range(n))
    for i in range(n):
        if form in ("pll", "pll_word"):
            x = list(t)
            x[i] = SP.mask
            j = i + 1
            while form == "pll_word" and j < n and not word_start[j]:
                x[j] = SP.mask
                j += 1
            xt = torch.tensor([x])
            logits = model(Batch(xt, xt, _pos(n), torch.zeros_like(xt), "bidirectional")).logits[0]
            total += _lp(logits[i], t[i])
        elif form == "masked_next":
            x = [SP.eos, *t]
            x[i + 1] = SP.mask
            xt = torch.tensor([x])
            batch = Batch(xt, xt, _pos(n + 1), torch.zeros_like(xt), "prefix",
                          prefix_mask=torch.ones_like(xt, dtype=torch.bool))  # fmt: skip
            total += _lp(model(batch).logits[0, i], t[i])
        elif form == "sentinel_span":
            s0 = SP.sentinel(0)
            logits = _enc_dec(model, [*t[:i], s0, *t[i + 1 :], SP.eos], [SP.pad, s0])
            total += _lp(logits[1], t[i])
        elif form == "span_nlu":
            s0 = SP.sentinel(0)
            logits = _enc_dec(model, [SP.nlu, *t[:i], s0, *t[i + 1 :], SP.eos], [SP.pad, s0])
            total += _lp(logits[1], t[i])
        elif form == "bart_mask":
            logits = _enc_dec(model, [*t[:i], SP.mask, *t[i + 1 :], SP.eos], [SP.pad, *t[:-1]])
            total += _lp(logits[i], t[i])
    return total


@pytest.mark.parametrize(
    ("kind", "form"),
    [
        ("decoder", "causal"),
        ("decoder", "masked_next"),
        ("encoder", "pll"),
        ("encoder", "pll_word"),
        ("encdec", "sentinel_span"),
        ("encdec", "span_nlu"),
        ("encdec", "bart_mask"),
        ("encdec", "encdec_lm"),
    ],
)
def test_each_form_agrees_with_a_slow_loop(kind: str, form: str) -> None:
    model = _model(kind)
    sents, starts = _sentences()
    enc = blimp.encode_sentences(sents, starts)
    # a small token budget: many chunks of several widths
    fast = blimp.score_sentences(model, form, enc, SP, batch_tokens=24)
    slow = np.array([_reference(model, form, t, w) for t, w in zip(sents, starts, strict=True)])
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-3)
    assert fast.shape == (len(sents),)


def test_the_chunk_size_follows_the_device_and_does_not_change_the_scores() -> None:
    """The default chunk is small on a CPU (cache-sized) and large on an accelerator; scores at the
    default, at one large chunk and at many small ones agree to float rounding."""
    assert blimp.batch_tokens_for("cpu") < blimp.batch_tokens_for(torch.device("cuda"))
    model = _model("encoder")
    sents, starts = _sentences()
    enc = blimp.encode_sentences(sents, starts)
    default = blimp.pll_scores(model, enc, SP)
    for size in (10**6, 24):
        for a, b in zip(default, blimp.pll_scores(model, enc, SP, batch_tokens=size), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_pll_word_differs_from_pll_only_on_multi_piece_words() -> None:
    model = _model("encoder")
    sents, _ = _sentences()
    whole = blimp.encode_sentences(sents)  # every token a word of its own
    pll, within = blimp.pll_scores(model, whole, SP)
    np.testing.assert_array_equal(pll, within)
    split = blimp.encode_sentences(sents, [[True] + [False] * (len(s) - 1) for s in sents])
    pll2, within2 = blimp.pll_scores(model, split, SP)
    np.testing.assert_allclose(pll2, pll, rtol=1e-6)
    assert within2[0] == pytest.approx(pll2[0])  # one token: nothing later to mask
    assert (np.abs(within2 - pll2)[1:] > 1e-6).all()


def test_forms_come_from_the_objective() -> None:
    def forms(name: str, kind: str, **over: object) -> tuple[str, ...]:
        return build_objective(name, SP, None, model_kind=kind, overrides=dict(over)).pair_forms()  # type: ignore[arg-type]

    assert forms("clm", "decoder") == ("causal",)
    assert forms("mlm", "encoder", vocab_size=V) == ("pll_word", "pll")
    assert forms("span", "encdec") == ("sentinel_span",)
    assert forms("span", "decoder") == ("causal",)
    assert forms("ul2", "encdec") == ("span_nlu",)
    assert forms("prefix_lm", "encdec") == ("encdec_lm",)
    mixed = forms("mixture", "encdec", components=[{"objective": "span"}, {"objective": "prefix_lm"}])
    assert mixed == ("sentinel_span", "encdec_lm")
    assert all(f in blimp.FORMS for f in (*mixed, *forms("mlm", "encoder", vocab_size=V)))


# --- the n-gram baseline ------------------------------------------------------------------------------


def test_ngram_is_a_distribution_and_learns_its_counts() -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(20, 30, size=int(rng.integers(3, 12))) for _ in range(50)]
    docs += [np.array([20, 21, 22, 23])] * 30
    model = blimp.NGram(docs, 32, 3, context=3)
    # every next token after one context, each scored through `score`
    total = 0.0
    for c in range(32):
        total += float(np.exp(model.score(blimp.encode_sentences([[20, 21, c]]))[0] - model.score(
            blimp.encode_sentences([[20, 21]]))[0]))  # fmt: skip
    assert total == pytest.approx(1.0, abs=1e-9)
    seen = model.score(blimp.encode_sentences([[20, 21, 22, 23]]))[0]
    shuffled = model.score(blimp.encode_sentences([[23, 22, 21, 20]]))[0]
    assert seen > shuffled


# --- the CLI ------------------------------------------------------------------------------------------


@pytest.fixture
def cli(objtrain_cli: Callable[..., tuple[int, str, str]]) -> Callable[..., tuple[int, str, str]]:
    return lambda *args: objtrain_cli("eval", *args)


SKIP = "lm,conditional,corrupted,infill,probe,sentence_order,samples"


def test_cli_refuses_bad_pair_files_in_one_line(cli, debug_checkpoint, tmp_path: Path) -> None:
    ckpt = debug_checkpoint("decoder", training={"objective": "clm"})
    (tmp_path / "held_out.txt").write_text("x = 1\n", encoding="utf-8")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(_pairs_rows(1)[0]) + "\n{oops\n", encoding="utf-8")
    no_field = _write(tmp_path / "nofield.jsonl", [{"sentence_good": "a", "sentence_bad": "b"}])
    for path, message in (
        (tmp_path / "nothing.jsonl", "not found"),
        (bad_json, "line 2 is not JSON"),
        (no_field, "no string field 'UID'"),
    ):
        code, out, err = cli(ckpt, "--data", tmp_path / "held_out.txt", "--blimp", path, "--skip", SKIP)
        assert code == 2, err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert out == ""


def test_cli_reports_accuracy_ties_terms_and_baselines(cli, debug_checkpoint, tmp_path: Path) -> None:
    pairs = _write(tmp_path / "p.jsonl.gz", _pairs_rows())
    paper = tmp_path / "paper.jsonl"
    row = {"UID": "island_effects_1", "linguistics_term": "island_effects", "gpt2": 0.9}
    paper.write_text(json.dumps(row) + "\n", encoding="utf-8")
    text = tmp_path / "held_out.txt"
    text.write_text("def f(x):\n    return x + 1\n", encoding="utf-8")
    ckpt = debug_checkpoint("encoder", training={"objective": "mlm"})
    code, out, err = cli(ckpt, "--data", text, "--blimp", pairs, "--blimp-paper", paper, "--skip", SKIP,
                         "--format", "json")  # fmt: skip
    assert code == 0, err
    d = json.loads(out)
    assert d["blimp_form"] == "pll_word" and d["blimp_accuracy"] == d["blimp_pll_word_accuracy"]
    assert 0.0 <= d["blimp_accuracy"] <= 1.0 and "blimp_pll_accuracy" in d and "blimp_tie_rate" in d
    assert d["blimp_pairs"] == 12.0
    assert set(d["blimp_by_term"]) == set(TERMS)
    assert 0.0 <= d["blimp_random_init_accuracy"] <= 1.0
    assert d["blimp_by_term"]["island_effects"]["paper"] == {"gpt2": 0.9}
    assert "no training store" in d["blimp_ngram_skipped"]  # a text file: no training tokens to count
    code, out, err = cli(ckpt, "--data", text, "--blimp", pairs, "--skip", SKIP)
    assert code == 0, err
    assert "blimp_accuracy" in out and "subject_verb_agreement" in out
    code, out, err = cli(ckpt, "--data", text, "--blimp", pairs, "--blimp-per-paradigm", "1",
                         "--blimp-ngram", "0", "--skip", SKIP, "--format", "json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["blimp_pairs"] == 6.0


@torch.no_grad()
def test_an_encoder_trained_on_sentence_pairs_reads_segment_zero() -> None:
    model = _model("encoder")
    sents, _ = _sentences()
    enc = blimp.encode_sentences(sents)
    fast = blimp.score_sentences(model, "pll", enc, SP, segments=True)
    slow = []
    for t in sents:
        total = 0.0
        for i in range(len(t)):
            x = torch.tensor([[SP.mask if j == i else v for j, v in enumerate(t)]])
            batch = Batch(
                x, x, _pos(len(t)), torch.zeros_like(x), "bidirectional", segment_ids=torch.zeros_like(x)
            )
            total += _lp(model(batch).logits[0, i], t[i])
        slow.append(total)
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-3)
    assert not np.allclose(fast, blimp.score_sentences(model, "pll", enc, SP))  # the segment row is added
