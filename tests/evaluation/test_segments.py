"""Segment ids at evaluation: only models trained on sentence pairs (NSP/SOP) read segment row 0.

The zoo's encoders all carry a segment embedding; MLM never feeds it, so its rows stay random. Fill-mask,
probes and fine-tuning of such a model must read no segment ids, as transformers does on its export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation import finetune
from objtrain.evaluation.probe import Labelled, layer_features, padded, trained_with_segments
from objtrain.models import generate as gen
from objtrain.models.checkpoint import load_checkpoint, save_checkpoint
from objtrain.models.zoo import build_model, model_config

TEXT = "def [MASK](self):\n    return self.value"


def _encoder(tokenizer: Tokenizer) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(model_config("encoder", "debug", vocab_size=tokenizer.vocab_size)).eval()
    assert model.segment is not None  # type: ignore[union-attr]
    with torch.no_grad():  # rows far from zero, so that adding one shows in every output
        model.segment.weight.normal_(0.0, 1.0)  # type: ignore[union-attr]
    return model


def _probs(model: torch.nn.Module, ids: list[int], segment_ids: torch.Tensor | None) -> torch.Tensor:
    x = torch.tensor([ids])
    batch = Batch(
        x, x, torch.arange(x.size(1))[None], torch.zeros_like(x), "bidirectional", segment_ids=segment_ids
    )
    with torch.no_grad():
        return model(batch).logits[0].float().softmax(-1)


def test_the_rule_reads_the_training_record() -> None:
    assert trained_with_segments({"objective": "nsp"}) and trained_with_segments({"objective": "sop"})
    for objective in ("mlm", "clm", "span", "contrastive", None):
        assert not trained_with_segments({"objective": objective})
    assert not trained_with_segments({})
    mixture = {"objective": "mixture", "objective_config": {"components": [{"objective": "sop"}]}}
    assert trained_with_segments(mixture)


def test_fill_mask_of_an_mlm_encoder_reads_no_segment_ids(tokenizer: Tokenizer) -> None:
    model = _encoder(tokenizer)
    ids, _ = gen.encode_input(tokenizer, TEXT)
    where = ids.index(tokenizer.specials.mask)
    text_ids = tokenizer.specials.ordinary_ids(tokenizer.vocab_size)
    bare = _probs(model, ids, None)[where]
    sentence_a = _probs(model, ids, torch.zeros(1, len(ids), dtype=torch.int64))[where]
    assert (bare - sentence_a).abs().max() > 1e-4  # the segment row does move the answer
    top = gen.fill_mask(model, tokenizer, TEXT, top_k=3)[0]  # type: ignore[arg-type]
    assert [c.token_id for c in top] == text_ids[bare[text_ids].topk(3).indices].tolist()
    assert [c.prob for c in top] == pytest.approx(bare[[c.token_id for c in top]].tolist(), abs=1e-6)
    # a model trained on sentence pairs reads its text as sentence A
    nsp = gen.fill_mask(model, tokenizer, TEXT, top_k=3, segments=True)[0]  # type: ignore[arg-type]
    assert [c.prob for c in nsp] == pytest.approx(sentence_a[[c.token_id for c in nsp]].tolist(), abs=1e-6)


def test_probe_features_of_an_mlm_encoder_add_no_segment_row(tokenizer: Tokenizer) -> None:
    model = _encoder(tokenizer)
    texts = ["def f(x):\n    return x", "import os", "class A:\n    pass"]
    feats = layer_features(model, tokenizer, texts, 32, layers="all")
    sentence_a = layer_features(model, tokenizer, texts, 32, layers="all", segments=True)
    ids, valid, _ = padded([tokenizer.encode(t) for t in texts], tokenizer.specials.pad)
    docs = torch.where(valid, 0, -1)
    pos = torch.arange(ids.size(1)).expand_as(ids)
    with torch.no_grad():
        for seg, got in ((None, feats), (torch.zeros_like(ids), sentence_a)):
            hidden = model.last_hidden(Batch(ids, ids, pos, docs, "bidirectional", segment_ids=seg)).double()  # type: ignore[operator]
            w = valid.double()[..., None]
            assert torch.allclose(got[-1], (hidden * w).sum(1) / w.sum(1), atol=1e-6)
    assert not torch.allclose(feats[-1], sentence_a[-1], atol=1e-3)
    # the row is never read: scrambling it leaves every layer's features as they were
    with torch.no_grad():
        model.segment.weight.mul_(-3.0)  # type: ignore[union-attr]
    again = layer_features(model, tokenizer, texts, 32, layers="all")
    assert all(torch.equal(a, b) for a, b in zip(feats, again, strict=True))


def test_suite_and_generate_decide_from_the_checkpoint(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """`objtrain generate` and the suite's probe take the rule from the checkpoint's objective."""
    from objtrain.cli.generate import _fill_mask
    from objtrain.evaluation.suite import EvalOptions, _probe

    model = _encoder(tokenizer)
    paths = {
        name: save_checkpoint(
            tmp_path / name, model, tokenizer.specials, tokenizer, {"objective": name, "seq_len": 32}
        )
        for name in ("mlm", "nsp")
    }
    ids, _ = gen.encode_input(tokenizer, TEXT)
    where = ids.index(tokenizer.specials.mask)
    for name, seg in (("mlm", None), ("nsp", torch.zeros(1, len(ids), dtype=torch.int64))):
        ckpt = load_checkpoint(paths[name])
        ckpt.model.eval()
        result = _fill_mask(ckpt, TEXT, 3)
        expected = _probs(ckpt.model, ids, seg)[where]
        assert [m["prob"] for m in result["masks"][0]] == pytest.approx(
            expected[[m["id"] for m in result["masks"][0]]].tolist(), abs=1e-6
        )
    # the MLM checkpoint's probe does not change when its (untrained) segment rows do
    options = EvalOptions(probe_layers="last", batch_size=8)
    ckpt = load_checkpoint(paths["mlm"])
    ckpt.model.eval()
    before = _probe(ckpt, options, 32, torch.device("cpu"))
    with torch.no_grad():
        ckpt.model.segment.weight.mul_(-3.0)  # type: ignore[union-attr]
    assert _probe(ckpt, options, 32, torch.device("cpu")) == before


def test_finetune_of_an_mlm_encoder_reads_no_segment_ids(tokenizer: Tokenizer) -> None:
    model = _encoder(tokenizer)
    texts = ["def f(x):\n    return x", "import os", "class A:\n    pass", "x = 1"] * 3
    data = Labelled(texts, ["a", "b", "a", "b"] * 3)
    config = finetune.FinetuneConfig(steps=4, batch_size=4)
    first = finetune.finetune(model, tokenizer, data, data, data, 16, 0, config)
    with torch.no_grad():
        model.segment.weight.mul_(-3.0)  # type: ignore[union-attr]
    assert finetune.finetune(model, tokenizer, data, data, data, 16, 0, config) == first


def test_fill_mask_equals_transformers_pipeline_on_the_export(tmp_path: Path, tokenizer: Tokenizer) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="the 'hf' extra (transformers) is not installed"
    )
    pytest.importorskip("google.protobuf", reason="the 'hf' extra (protobuf) is not installed")
    if not hasattr(transformers, "EuroBertForMaskedLM"):
        pytest.skip("this transformers has no EuroBertForMaskedLM (added in transformers 5)")
    from objtrain.cli.generate import _fill_mask
    from objtrain.interop.export import export_checkpoint

    model = _encoder(tokenizer)
    path = save_checkpoint(
        tmp_path / "mlm", model, tokenizer.specials, tokenizer, {"objective": "mlm", "seq_len": 64}
    )
    export_checkpoint(path, tmp_path / "hf")
    ckpt = load_checkpoint(path)
    ckpt.model.eval()
    ours = _fill_mask(ckpt, "def [MASK](self):", 3)["masks"][0]
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), dtype=torch.float32)
    # the pipeline ranks every id; objtrain offers text tokens only (reserved ids are no text to fill in)
    text_ids = set(tokenizer.specials.ordinary_ids(tokenizer.vocab_size).tolist())
    ranked = pipe(f"def {pipe.tokenizer.mask_token}(self):", top_k=10)
    theirs = [r for r in ranked if r["token"] in text_ids][:3]
    assert [m["id"] for m in ours] == [r["token"] for r in theirs]
    assert [m["prob"] for m in ours] == pytest.approx([r["score"] for r in theirs], abs=1e-5)
