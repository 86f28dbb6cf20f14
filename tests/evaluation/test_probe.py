"""Linear probes: separable data near 100%, shuffled labels near chance, readers and their refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from objtrain.errors import UserError
from objtrain.evaluation.probe import mcc, read_labelled, run_probe


def _blobs(n: int, d: int, seed: int, shift: float) -> tuple[torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    x[:, :3] += shift * torch.nn.functional.one_hot(y, 3).double()
    return x, [f"c{int(v)}" for v in y]


def test_separable_data_is_learned_almost_perfectly() -> None:
    xt, yt = _blobs(300, 16, 0, 8.0)
    xv, yv = _blobs(200, 16, 1, 8.0)
    out = run_probe(xt, yt, xv, yv)
    assert out["probe_accuracy"] > 0.97 and out["probe_classes"] == 3
    assert out["probe_majority_accuracy"] < 0.5


def test_shuffled_labels_stay_near_chance() -> None:
    xt, yt = _blobs(600, 16, 0, 8.0)
    xv, yv = _blobs(600, 16, 1, 8.0)
    order = torch.randperm(len(yt), generator=torch.Generator().manual_seed(2)).tolist()
    shuffled = [yt[i] for i in order]
    out = run_probe(xt, shuffled, xv, yv)
    assert abs(out["probe_accuracy"] - 1 / 3) < 0.08  # 600 examples: chance +- about 3 standard errors


def test_probe_is_deterministic_and_constant_features_give_the_majority() -> None:
    xt, yt = _blobs(100, 8, 0, 2.0)
    xv, yv = _blobs(80, 8, 1, 2.0)
    assert run_probe(xt, yt, xv, yv) == run_probe(xt, yt, xv, yv)
    labels = ["a"] * 70 + ["b"] * 30
    out = run_probe(torch.ones(100, 4, dtype=torch.float64), labels, torch.ones(40, 4, dtype=torch.float64),
                    ["a"] * 25 + ["b"] * 15)  # fmt: skip
    assert out["probe_accuracy"] == pytest.approx(25 / 40) and out["probe_mcc"] == 0.0


def test_mcc_known_values() -> None:
    gold = torch.tensor([1, 1, 0, 0])
    assert mcc(gold, gold) == 1.0 and mcc(1 - gold, gold) == -1.0 and mcc(torch.ones(4), gold) == 0.0


def test_readers_take_sst_cola_glue_and_jsonl(tmp_path: Path) -> None:
    (tmp_path / "sst").write_text("1 a fine film .\n0 a dull one .\n", encoding="utf-8")
    (tmp_path / "cola.tsv").write_text("gj04\t1\t\tOur friends won't buy this.\nx\t0\t*\tThey drank pub.\n")
    (tmp_path / "glue.tsv").write_text("sentence\tlabel\nnice\t1\nbad\t0\n")
    (tmp_path / "d.jsonl").write_text('{"text": "why", "label": 2}\n{"sentence": "who", "label": "HUM"}\n')
    (tmp_path / "bad.txt").write_bytes(b"0 sister\xf0city\n1 fine\n")
    assert read_labelled(tmp_path / "sst").labels == ["1", "0"]
    cola = read_labelled(tmp_path / "cola.tsv")
    assert cola.labels == ["1", "0"] and cola.texts[1] == "They drank pub."
    assert read_labelled(tmp_path / "glue.tsv").texts == ["nice", "bad"]
    assert read_labelled(tmp_path / "d.jsonl").labels == ["2", "HUM"]
    bad = read_labelled(tmp_path / "bad.txt")
    assert bad.replaced_lines == 1 and bad.labels == ["0", "1"]


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("a.jsonl", '{"text": "no label here"}\n', "no 'label' field"),
        ("b.tsv", "sentence\tscore\nnice\t0.5\n", "no 'label' column"),
        ("c.txt", "just a sentence without a label\n", "no label column"),
        ("d.tsv", "some text here\tmore text here\n", "no label column"),
        ("e.txt", "\n\n", "empty"),
    ],
)
def test_a_file_without_labels_is_one_clear_error(
    tmp_path: Path, name: str, content: str, fragment: str
) -> None:
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=fragment):
        read_labelled(tmp_path / name)


def test_a_directory_or_an_empty_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(UserError, match=r"is a directory, not a file"):
        read_labelled(tmp_path / "dir")
    (tmp_path / "none.tsv").write_bytes(b"")
    with pytest.raises(UserError, match=r"none\.tsv is empty"):
        read_labelled(tmp_path / "none.tsv")
    with pytest.raises(UserError, match=r"not found"):
        read_labelled(tmp_path / "missing.tsv")


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("1 a fine film .\n0 a dull one .\n".encode("utf-16"), "offset 0, line 1"),  # BOM, then NULs
        (b"1 a fine film .\n\x1f\x8b\x08\x00\xffgz\n\xfe\xfe\n", "offset 17, line 2"),  # mostly binary
        ("sentence\tlabel\ncafé\t1\nnaïve\t0\n".encode("latin-1"), "offset 18, line 2"),  # most lines
    ],
    ids=["utf-16", "binary", "latin-1"],
)
def test_a_file_that_is_not_utf8_says_so(tmp_path: Path, content: bytes, where: str) -> None:
    (tmp_path / "p.txt").write_bytes(content)
    with pytest.raises(UserError, match=rf"p\.txt is not UTF-8 text \((invalid|NUL) byte at {where}\)"):
        read_labelled(tmp_path / "p.txt")


def test_a_stray_byte_is_named_when_the_labels_are_also_missing(tmp_path: Path) -> None:
    # A stray byte alone is tolerated (see the readers test); when the file fails anyway, both show.
    (tmp_path / "q.txt").write_bytes(b"just a sentence without a label\nand another \xff one\nand a third\n")
    with pytest.raises(
        UserError, match=r"no label column.*; 1 line is not UTF-8 \(first invalid byte at offset 44, line 2\)"
    ):
        read_labelled(tmp_path / "q.txt")


@pytest.mark.parametrize(
    ("name", "content", "line"),
    [
        ("s.txt", "1 good\n\n0 bad\n\nnolabelhere\n", 5),  # blank lines count: the file's own line numbers
        ("g.tsv", "sentence\tlabel\n\nfine\t1\nbroken\t\n", 4),  # the header is line 1
        ("d.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b"}\n', 3),
    ],
)
def test_errors_name_the_line_of_the_file(tmp_path: Path, name: str, content: str, line: int) -> None:
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=rf"{name}:{line}: "):
        read_labelled(tmp_path / name)


def test_a_byte_order_mark_is_not_part_of_the_first_label(tmp_path: Path) -> None:
    body = "".join(f"{label}\ttext {i}\n" for i in range(4) for label in ("pos", "neg"))
    (tmp_path / "bom.tsv").write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    read = read_labelled(tmp_path / "bom.tsv")
    assert sorted(set(read.labels)) == ["neg", "pos"] and len(read.texts) == 8


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
def test_features_skip_the_unembedding_and_come_back_in_the_texts_order(kind: str, tokenizer) -> None:
    """The probe's features equal the forward pass's hidden states, whatever order they are batched in."""
    from objtrain.batch import Batch
    from objtrain.evaluation.probe import _trunk_blocks, layer_features, padded
    from objtrain.models.zoo import build_model, model_config

    torch.manual_seed(0)
    model = build_model(model_config(kind, "debug", vocab_size=tokenizer.vocab_size)).eval()
    texts = ["def f(x):", "return", "import os, sys  # a longer line of code to pad the others", "", "x = 1"]
    if kind != "encdec":  # the normed hidden states without the logits are the forward pass's own
        ids, valid, _ = padded([tokenizer.encode(t) or [tokenizer.specials.eos] for t in texts], 0)
        docs = torch.where(valid, 0, -1)
        positions = torch.arange(ids.size(1)).expand_as(ids)
        attention = "causal" if kind == "decoder" else "bidirectional"
        batch = Batch(ids, ids, positions, docs, attention, segment_ids=torch.zeros_like(ids))  # type: ignore[arg-type]
        with torch.no_grad():
            assert torch.equal(model.last_hidden(batch), model(batch).hidden)
    batched = layer_features(model, tokenizer, texts, 32, batch_size=2, layers="all")
    one_by_one = [layer_features(model, tokenizer, [t], 32, batch_size=1, layers="all") for t in texts]
    assert len(batched) == len(one_by_one[0]) == len(_trunk_blocks(model))  # every layer's output
    for layer, feats in enumerate(batched):
        assert feats.shape == (len(texts), model.config.d_model)
        alone = torch.cat([f[layer] for f in one_by_one])
        torch.testing.assert_close(feats, alone, rtol=1e-5, atol=1e-6)
