"""`objtrain export`: stock transformers classes load the export and compute what objtrain computes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from interop_helpers import tiny_checkpoint

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.interop import llama

transformers = pytest.importorskip("transformers", reason="the 'hf' extra (transformers) is not installed")
pytest.importorskip("google.protobuf", reason="the 'hf' extra (protobuf) is not installed")

from objtrain.interop.export import _objtrain_logits, export_checkpoint, sample_rows  # noqa: E402
from objtrain.models.checkpoint import load_checkpoint  # noqa: E402


def test_half_split_round_trip_and_scores() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    assert torch.equal(llama.to_interleaved(llama.to_half_split(w, 4), 4), w)
    assert not torch.equal(llama.to_half_split(w, 4), w)


def test_decoder_exports_as_llama_with_equal_logits_and_greedy(tmp_path: Path, tokenizer: Tokenizer) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_parameters"]["rope_theta"] == 10000.0 and config["tie_word_embeddings"] is True
    assert summary.greedy_tokens == 32 and summary.max_logit_diff < 1e-4
    # independently of the export's own check: reload and compare on fresh rows
    ours = load_checkpoint(ckpt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    ids = sample_rows(ours, n_rows=4, length=48, seed=7)
    with torch.no_grad():
        diff = (_objtrain_logits(ours.model, ids) - hf(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-4
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (2, 3, 0)


def test_without_the_rope_permutation_the_check_fails(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load-back check is what stands between a layout bug and a silently wrong model."""
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    monkeypatch.setattr(llama, "to_half_split", lambda w, n: w)
    with pytest.raises(UserError, match="load-back check failed"):
        export_checkpoint(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary left either


def test_mtp_exports_trunk_and_head_one(tmp_path: Path, tokenizer: Tokenizer) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, mtp_heads=3)
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert any("head 1" in note for note in summary.notes)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2


def test_encoder_exports_as_eurobert(tmp_path: Path, tokenizer: Tokenizer) -> None:
    if not hasattr(transformers, "EuroBertForMaskedLM"):
        pytest.skip("this transformers has no EuroBertForMaskedLM (added in transformers 5)")
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encoder")
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert summary.architecture == "EuroBertForMaskedLM" and summary.max_logit_diff < 1e-4
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    ours = load_checkpoint(ckpt)
    ids = sample_rows(ours, n_rows=2, length=40, seed=3)
    with torch.no_grad():
        assert float((_objtrain_logits(ours.model, ids) - hf(input_ids=ids).logits).abs().max()) < 1e-4


def test_encdec_exports_with_its_modelling_code_and_loads_with_trust_remote_code(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    from objtrain.interop.export import _objtrain_encdec_logits

    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encdec")
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert summary.architecture == "ObjtrainEncDecForConditionalGeneration"
    assert summary.max_logit_diff < 1e-4 and summary.greedy_tokens == 32
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (
        config["auto_map"]["AutoModelForSeq2SeqLM"]
        == "modeling_objtrain.ObjtrainEncDecForConditionalGeneration"
    )
    assert (tmp_path / "hf" / "modeling_objtrain.py").is_file()
    # independently of the export's own check: the final directory, fresh rows, a padded encoder input
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32, trust_remote_code=True
    ).eval()
    ours = load_checkpoint(ckpt)
    ids = sample_rows(ours, n_rows=3, length=40, seed=5)
    dec = sample_rows(ours, n_rows=3, length=24, seed=6)
    with torch.no_grad():
        diff = _objtrain_encdec_logits(ours.model, ids, dec) - hf(input_ids=ids, decoder_input_ids=dec).logits
        assert float(diff.abs().max()) < 1e-4
        short = _objtrain_encdec_logits(ours.model, ids[:1, :30], dec[:1])
        mask = torch.ones(1, 40, dtype=torch.long)
        mask[:, 30:] = 0  # padding after the document is masked out
        padded = hf(input_ids=ids[:1], attention_mask=mask, decoder_input_ids=dec[:1]).logits
        assert float((short - padded).abs().max()) < 1e-4
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok.convert_tokens_to_ids("<extra_id_0>") == ours.specials.sentinel(0)


def test_encdec_export_with_wrong_modelling_code_fails_and_leaves_nothing(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objtrain.interop import export

    original = export._remote_source

    def broken(name: str) -> str:  # a GELU where objtrain has SiLU
        source = original(name)
        return source.replace("F.silu(gate)", "F.gelu(gate)")

    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encdec")
    monkeypatch.setattr(export, "_remote_source", broken)
    with pytest.raises(UserError, match="load-back check failed"):
        export_checkpoint(ckpt, tmp_path / "hf")
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_nsp_encoder_is_refused_mlm_heads_left_out(tmp_path: Path, tokenizer: Tokenizer) -> None:
    nsp = tiny_checkpoint(
        tmp_path / "nsp", tokenizer, kind="encoder", objective="nsp", n_segments=2, n_classes=2
    )
    with pytest.raises(UserError, match="sentence pairs"):
        export_checkpoint(nsp, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    # an MLM encoder of the zoo has both too, untrained: they are left out, and said so
    mlm = tiny_checkpoint(tmp_path / "mlm", tokenizer, kind="encoder", n_segments=2, n_classes=2)
    summary = export_checkpoint(mlm, tmp_path / "hf")
    assert any("pooled head left out" in note for note in summary.notes)


def test_autotokenizer_round_trip_and_special_ids(
    tmp_path: Path, tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    export_checkpoint(tiny_checkpoint(tmp_path / "ck", tokenizer), tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    hard = [
        "\tdef  f(x):\r\n\t\treturn x  ",
        " lead",
        "trail ",
        "caf\u00e9 \u4e2d\u6587 \U0001f600",
        "",
        "a\x00b",
    ]
    for text in [*hard, *stdlib_texts]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert ids == tokenizer.encode(text)
    assert tok("x")["input_ids"] == tokenizer.encode("x")  # no BOS/EOS added
    specials = tokenizer.specials
    for name in ("pad", "unk", "bos", "eos", "mask", "cls", "sep"):
        assert getattr(tok, f"{name}_token_id") == getattr(specials, name)
    assert tok.convert_tokens_to_ids(["<fim_prefix>", "<fim_middle>", "<extra_id_0>"]) == [
        specials.fim_prefix,
        specials.fim_middle,
        specials.sentinel(0),
    ]
    assert len(tok) == tokenizer.vocab_size


def test_cli_torn_checkpoint_refused_leaving_nothing(
    tmp_path: Path, tokenizer: Tokenizer, objtrain_cli: Callable[..., tuple[int, str, str]]
) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, err = objtrain_cli("export", ckpt, "-o", tmp_path / "hf")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "not a readable safetensors file" in err
    assert not (tmp_path / "hf").exists()
    code, _, err = objtrain_cli("export", tmp_path / "nothing", "-o", tmp_path / "hf")
    assert code == 2 and "no checkpoint or run directory" in err


def test_an_export_serves_as_tokenize_tokenizer(
    tmp_path: Path, tokenizer: Tokenizer, objtrain_cli: Callable[..., tuple[int, str, str]]
) -> None:
    export_checkpoint(tiny_checkpoint(tmp_path / "ck", tokenizer), tmp_path / "hf")
    (tmp_path / "a.txt").write_text("def f(x):\n    return x\n")
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "a.txt", "--tokenizer", tmp_path / "hf", "-o", tmp_path / "s"
    )
    assert code == 0, err
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["tokenizer"]["hash"] == tokenizer.hash
