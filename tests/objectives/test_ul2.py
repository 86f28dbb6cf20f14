"""UL2 mixture of denoisers (reference section 7): the denoiser table, mode tokens, lengths, mixing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from objtrain import IGNORE
from objtrain.errors import UserError
from objtrain.objectives.noise import random_spans_helper
from objtrain.objectives.registry import build_objective, objective_config, objective_defaults
from objtrain.objectives.ul2 import UL2
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
MODES = {SP.nlu: "R", SP.nlg: "X", SP.s2s: "S"}


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("ul2") == dataclasses.asdict(UL2.Config())
    assert objective_config("ul2") == UL2.Config()


def test_default_table_is_the_papers() -> None:
    """The 7 denoisers of section 7 with their mode tokens, weighted 40% R / 40% X / 20% S."""
    table = [(d.kind, d.mean_noise_span_length, d.noise_density, d.mode) for d in UL2.Config().denoisers]
    assert table == [
        ("R", 3.0, 0.15, "nlu"),
        ("R", 8.0, 0.15, "nlu"),
        ("X", 3.0, 0.5, "nlg"),
        ("X", 8.0, 0.5, "nlg"),
        ("X", 64.0, 0.15, "nlg"),
        ("X", 64.0, 0.5, "nlg"),
        ("S", 3.0, 0.25, "s2s"),
    ]
    shares: dict[str, float] = {}
    for d in UL2.Config().denoisers:
        shares[d.kind] = shares.get(d.kind, 0.0) + d.weight
    assert shares == pytest.approx({"R": 0.4, "X": 0.4, "S": 0.2})


def test_raw_length_is_the_largest_denoiser_need() -> None:
    """Rows hold max over denoisers of the helper's raw length (X(64, .5) at 512 needs the most), each
    denoiser with one input position spent on the mode token."""
    obj = build_objective("ul2", SP)
    assert obj.raw_length(512) == random_spans_helper(511, 0.5, 64.0)[0]
    assert obj.model_length(obj.raw_length(512)) == 512  # type: ignore[attr-defined]
    assert obj.widths(obj.raw_length(512)) == (512, 511)  # type: ignore[attr-defined]


def test_denoiser_shares_follow_the_weights() -> None:
    obj = build_objective("ul2", SP)
    choice = obj.choose(torch.arange(20_000), 0)  # type: ignore[attr-defined]
    counts = torch.bincount(choice, minlength=7).double() / 20_000
    expected = torch.tensor([d.weight for d in UL2.Config().denoisers], dtype=torch.float64)
    assert float((counts - expected).abs().max()) < 0.015


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_rows_follow_their_denoiser(kind: str) -> None:
    """Every document's input starts with the row's mode token; R/X rows hold sentinels, S rows none;
    realised shares are reported in stats; labels never on padding."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(64)
    B = 32
    rows = torch.randint(O, O + 500, (B, L))
    docs = torch.zeros(B, L, dtype=torch.int64)
    docs[::2, L // 2 :] = 1
    batch = obj(rows, docs, torch.arange(B), 5)
    choice = obj.choose(torch.arange(B), 5)  # type: ignore[attr-defined]
    denoisers = obj.config.denoisers
    shares = sum(v for k, v in batch.stats.items() if k.startswith("share/"))
    assert shares == pytest.approx(1.0)
    for b in range(B):
        d = denoisers[int(choice[b])]
        ids = batch.input_ids[b]
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[1:] = batch.document_ids[b, 1:] != batch.document_ids[b, :-1]
        starts &= batch.document_ids[b] >= 0
        assert {MODES[int(t)] for t in ids[starts]} == {d.kind}
        has_sentinel = bool(SP.is_sentinel(ids).any())
        assert has_sentinel == (d.kind != "S")
    if kind == "encdec":
        assert batch.decoder_document_ids is not None
        assert bool(((batch.labels != IGNORE) == (batch.decoder_document_ids >= 0)).all())
    else:
        assert bool((batch.document_ids[batch.labels != IGNORE] >= 0).all())


def test_shorter_denoisers_use_a_prefix_of_the_row() -> None:
    """An S row only reads the first raw_S tokens: changing the rest of the row changes nothing."""
    obj = build_objective(
        "ul2",
        SP,
        overrides={
            "denoisers": [
                {"kind": "S", "weight": 1.0, "noise_density": 0.25, "mode": "s2s"},
                {
                    "kind": "X",
                    "weight": 0.0,
                    "mean_noise_span_length": 3.0,
                    "noise_density": 0.5,
                    "mode": "nlg",
                },
            ]
        },
    )
    L = obj.raw_length(32)
    rows = torch.randint(O, O + 500, (4, L))
    other = rows.clone()
    other[:, 31:] = O + 7
    a = obj(rows, torch.zeros_like(rows), torch.arange(4), 0)
    b = obj(other, torch.zeros_like(rows), torch.arange(4), 0)
    assert L > 31 and torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert a.stats["share/S(r=0.25)"] == 1.0


def test_batch_composition_does_not_change_a_row() -> None:
    obj = build_objective("ul2", SP)
    L = obj.raw_length(48)
    rows = torch.randint(O, O + 500, (8, L))
    docs = torch.zeros_like(rows)
    docs[1, 20:] = 1
    idx = torch.arange(8) + 1000
    whole = obj(rows, docs, idx, 2)
    a, b = obj(rows[:3], docs[:3], idx[:3], 2), obj(rows[3:], docs[3:], idx[3:], 2)
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([a.tensors()[name], b.tensors()[name]])), name


def test_sentinel_budget_is_checked() -> None:
    """Section 7 pitfall: X(3, .5) at 512 needs 128 sentinels; a tokenizer with fewer is refused."""
    obj = build_objective("ul2", Specials(n_sentinels=100))
    with pytest.raises(UserError, match="sentinels"):
        obj.raw_length(512)
    assert build_objective("ul2", Specials(n_sentinels=128)).raw_length(512) > 0


def test_bad_denoisers_are_user_errors() -> None:
    with pytest.raises(UserError):
        build_objective("ul2", SP, overrides={"denoisers": []})
    with pytest.raises(UserError):
        build_objective("ul2", SP, overrides={"denoisers": [{"kind": "Q"}]})
    with pytest.raises(UserError):
        build_objective("ul2", SP, overrides={"denoisers": [{"kind": "R", "weight": 0.0}]})


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_empty_and_tiny_documents(kind: str) -> None:
    """Padding-only rows stay padding; 1-token documents still get a mode token and an EOS."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(16)
    rows = torch.randint(O, O + 500, (6, L))
    docs = torch.full((6, L), -1)
    docs[:3, :4] = torch.tensor([0, 1, 2, 3])
    batch = obj(rows, docs, torch.arange(6), 0)
    assert bool((batch.document_ids[3:] == -1).all()) and bool((batch.labels[3:] == IGNORE).all())
    for b in range(3):
        starts = batch.input_ids[b][:1].tolist()
        assert starts[0] in MODES
        assert set(batch.document_ids[b].tolist()) - {-1} == {0, 1, 2, 3}
