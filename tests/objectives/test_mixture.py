"""Mixture of objectives: per-row choice, merging to common widths and attention, model-kind checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective
from objtrain.objectives.mixture import Mixture
from objtrain.objectives.registry import build_objective, objective_class, objective_defaults
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary


def mixture(components: list[dict], kind: str | None = None) -> Mixture:
    obj = build_objective("mixture", SP, model_kind=kind, overrides={"components": components})  # type: ignore[arg-type]
    assert isinstance(obj, Mixture)
    return obj


def rows_and_docs(B: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(B * 1000 + L)
    rows = torch.randint(O, O + 500, (B, L), generator=g)
    docs = torch.zeros(B, L, dtype=torch.int64)
    docs[1::2, L // 2 :] = 1
    rows[1::2, L // 2 - 1] = SP.eos
    docs[2::3, L - 4 :] = -1
    return rows, docs


def row_of(batch: Batch, b: int) -> dict[str, torch.Tensor]:
    """Row b of every tensor, with trailing padding removed (by document id)."""
    out = {}
    n_enc = int((batch.document_ids[b] >= 0).sum())
    n_dec = (
        int((batch.decoder_document_ids[b] >= 0).sum()) if batch.decoder_document_ids is not None else n_enc
    )
    for name, tensor in batch.tensors().items():
        decoder_side = name.startswith("decoder") or (name == "labels" and batch.is_encdec)
        out[name] = tensor[b, : n_dec if decoder_side else n_enc]
    return out


def check_rows_match_components(
    obj: Mixture, rows: torch.Tensor, docs: torch.Tensor, idx: torch.Tensor
) -> Batch:
    """Every merged row equals what its own component makes of that row alone (padding aside)."""
    batch = obj(rows, docs, idx, 3)
    choice = obj.choose(idx, 3)
    raws = obj._component_raw(rows.size(1))
    for b in range(rows.size(0)):
        k = int(choice[b])
        comp = obj.components[k]
        alone = comp(rows[b : b + 1, : raws[k]], docs[b : b + 1, : raws[k]], idx[b : b + 1], 3)
        mine, theirs = row_of(batch, b), row_of(alone, 0)
        for name, tensor in theirs.items():
            if name == "prefix_mask" or name not in mine:
                continue
            assert torch.equal(mine[name], tensor), (comp.name, name)
        if batch.prefix_mask is not None and alone.prefix_mask is None:
            full = alone.attention == "bidirectional"
            assert bool((mine["prefix_mask"] == full).all())
        elif batch.prefix_mask is not None and alone.prefix_mask is not None:
            assert torch.equal(mine["prefix_mask"], theirs["prefix_mask"])
    return batch


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("mixture") == dataclasses.asdict(Mixture.Config())


def test_shares_follow_weights() -> None:
    obj = mixture([{"objective": "span", "weight": 3.0}, {"objective": "prefix_lm", "weight": 1.0}])
    choice = obj.choose(torch.arange(20_000), 0)
    assert abs(float((choice == 0).double().mean()) - 0.75) < 0.015


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_span_and_prefix_lm(kind: str) -> None:
    """Two denoisers with different raw lengths: each row is its component's own output, padded to the
    widest component; realised shares in stats; overrides reach the component."""
    obj = mixture(
        [
            {"objective": "span", "weight": 0.5, "noise_density": 0.3},
            {"objective": "prefix_lm", "weight": 0.5},
        ],
        kind,
    )
    assert obj.model_kind == kind and obj.components[0].config.noise_density == 0.3
    L = obj.raw_length(48)
    rows, docs = rows_and_docs(12, L)
    batch = check_rows_match_components(obj, rows, docs, torch.arange(12))
    assert batch.stats["share/span"] + batch.stats["share/prefix_lm"] == pytest.approx(1.0)
    assert 0 < batch.stats["share/span"] < 1
    assert batch.input_ids.size(1) == 48
    label_docs = batch.decoder_document_ids if batch.is_encdec else batch.document_ids
    assert label_docs is not None and bool((batch.labels[label_docs < 0] == IGNORE).all())


def test_clm_and_prefix_lm_on_a_decoder() -> None:
    """Causal and prefix rows in one batch: attention "prefix", causal rows with an all-False prefix_mask."""
    obj = mixture([{"objective": "clm", "weight": 0.5}, {"objective": "prefix_lm", "weight": 0.5}])
    assert obj.model_kind == "decoder" and obj.attention == "prefix"
    L = obj.raw_length(32)
    assert L == 33
    rows, docs = rows_and_docs(10, L)
    batch = check_rows_match_components(obj, rows, docs, torch.arange(10))
    assert batch.prefix_mask is not None
    clm_rows = obj.choose(torch.arange(10), 3) == 0
    assert clm_rows.any() and (~clm_rows).any()
    assert not bool(batch.prefix_mask[clm_rows].any())
    assert bool(batch.prefix_mask[~clm_rows].any())


def test_batch_composition_does_not_change_a_row() -> None:
    obj = mixture([{"objective": "span", "weight": 0.5}, {"objective": "prefix_lm", "weight": 0.5}])
    L = obj.raw_length(40)
    rows, docs = rows_and_docs(8, L)
    idx = torch.arange(8) + 500
    whole = obj(rows, docs, idx, 1)
    a, b = obj(rows[:3], docs[:3], idx[:3], 1), obj(rows[3:], docs[3:], idx[3:], 1)
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([a.tensors()[name], b.tensors()[name]])), name


def test_empty_batch() -> None:
    obj = mixture([{"objective": "span", "weight": 0.5}, {"objective": "prefix_lm", "weight": 0.5}])
    rows = torch.zeros(0, obj.raw_length(16), dtype=torch.int64)
    batch = obj(rows, rows.clone(), torch.zeros(0, dtype=torch.int64), 0)
    assert batch.input_ids.shape == (0, 16)


def test_refusals_are_user_errors() -> None:
    with pytest.raises(UserError, match="share no model kind"):
        mixture([{"objective": "clm"}, {"objective": "bart"}])
    with pytest.raises(UserError, match="cannot train"):
        mixture([{"objective": "span"}, {"objective": "prefix_lm"}], "encoder")
    with pytest.raises(UserError, match="objective"):
        mixture([{"weight": 1.0}])
    with pytest.raises(UserError, match="empty"):
        mixture([])
    with pytest.raises(UserError, match="mixture"):
        mixture([{"objective": "mixture"}])
    with pytest.raises(UserError, match="weight"):
        mixture([{"objective": "span", "weight": -1}])
    with pytest.raises(UserError, match="unknown objective"):
        mixture([{"objective": "nope"}])


def test_objectives_with_their_own_loss_are_refused() -> None:
    if objective_class("mtp").loss is Objective.loss:
        pytest.skip("mtp uses the plain token loss")
    with pytest.raises(UserError, match="own loss"):
        mixture([{"objective": "clm"}, {"objective": "mtp"}])


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
@pytest.mark.parametrize("weights", [(0.5, 0.5), (0.9, 0.1), (0.1, 0.9)])
def test_each_row_is_fed_its_own_components_need(kind: str, weights: tuple[float, float]) -> None:
    """A row is fed its own component's raw need, not the largest component's: the loader streams exactly
    that, so at any weights the mixture leaves no more of its raw text unused than its components do
    (span's 568 raw tokens at 512 against prefix LM's ~511 left the rest of every prefix-LM row unread)."""
    from objtrain.data.batches import leading_batches
    from objtrain.data.stream import Documents, DocumentStream

    obj = mixture(
        [{"objective": "span", "weight": weights[0]}, {"objective": "prefix_lm", "weight": weights[1]}], kind
    )
    index = torch.arange(64)
    needs = obj.raw_lengths(512, index, 5)
    choice = obj.choose(index, 5)
    for k, comp in enumerate(obj.components):
        sel = choice == k
        assert torch.equal(needs[sel], comp.raw_lengths(512, index[sel], 5))
    assert int(needs.max()) <= obj.raw_length(512)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(200, 3000, (60,), generator=g)
    tokens = torch.randint(O, O + 500, (int(lengths.sum()),), generator=g).numpy()
    docs = Documents(tokens, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).numpy())
    stream = DocumentStream(docs, SP.eos, SP.pad, seed=0)
    batches = leading_batches(stream, obj, 512, 64, 32, seed=5)
    fed = sum(b.stats["raw_tokens_fed"] for b in batches)
    assert sum(b.stats["raw_tokens_unused"] for b in batches) / fed <= 0.01
