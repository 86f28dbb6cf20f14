"""Checkpoints: save -> load gives identical logits; bad checkpoints are refused in one line; the CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_helpers import make_batch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import objtrain.models.checkpoint as ck
from objtrain.cli import app
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models import build_model, model_config
from objtrain.specials import Specials


def trained_like(kind: str, tokenizer: Tokenizer, **overrides: object) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = model_config(kind, "debug", {"init_std": 0.3, **overrides}, vocab_size=tokenizer.vocab_size)
    return build_model(cfg).eval()


def batch_for(kind: str, vocab: int) -> object:
    batch = make_batch(
        [[0, 0, 0, 1, 1, 1, 1, -1]] * 2,
        "causal" if kind == "decoder" else "bidirectional",
        decoder_doc_rows=[[0, 0, 1, 1, 1]] * 2 if kind == "encdec" else None,
    )
    return batch


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
def test_save_load_gives_identical_logits(
    kind: str, tmp_path: Path, tokenizer: Tokenizer, specials: Specials
) -> None:
    model = trained_like(kind, tokenizer, **({"mtp_heads": 2} if kind == "decoder" else {}))
    path = ck.save_checkpoint(tmp_path / "ckpt", model, specials, tokenizer, {"objective": "x"})
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.model"]
    loaded = ck.load_checkpoint(path)
    batch = batch_for(kind, tokenizer.vocab_size)
    with torch.no_grad():
        a, b = model(batch), loaded.model(batch)  # type: ignore[operator]
    assert torch.equal(a.logits, b.logits)
    assert loaded.training == {"objective": "x"} and loaded.config == model.config
    assert loaded.tokenizer is not None and loaded.tokenizer.model_proto == tokenizer.model_proto


def test_tied_weights_saved_once_and_compile_prefix_stripped(
    tmp_path: Path, tokenizer: Tokenizer, specials: Specials
) -> None:
    model = trained_like("decoder", tokenizer)
    compiled = torch.compile(model)  # a wrapper whose state_dict keys start with _orig_mod.
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())
    path = ck.save_checkpoint(tmp_path / "c", compiled, specials, tokenizer)
    keys = set(load_file(str(path / ck.WEIGHTS)))
    assert keys == set(model.state_dict()) and "embed.weight" in keys
    assert not any("_orig_mod" in k or "lm_head.weight" in k for k in keys)


def test_crash_mid_save_leaves_the_old_checkpoint(
    tmp_path: Path, tokenizer: Tokenizer, specials: Specials, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = trained_like("decoder", tokenizer)
    path = ck.save_checkpoint(tmp_path / "c", model, specials, tokenizer)
    before = (path / ck.WEIGHTS).read_bytes()

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ck, "write_json", boom)
    with pytest.raises(OSError):
        ck.save_checkpoint(
            path, trained_like("decoder", tokenizer, n_layer=3), specials, tokenizer, force=True
        )
    assert (path / ck.WEIGHTS).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # no temporary directory left behind


def corrupt(path: Path, how: str) -> None:
    weights = path / ck.WEIGHTS
    if how == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        weights.write_bytes(b"\x00\x01 not a safetensors file")
    elif how == "shape":
        tensors = load_file(str(weights))
        tensors["blocks.0.mlp.w2.weight"] = torch.zeros(3, 3)
        save_file(tensors, str(weights))
    elif how == "missing":
        tensors = load_file(str(weights))
        del tensors["blocks.1.norm1.weight"]
        save_file(tensors, str(weights))
    elif how == "extra":
        tensors = load_file(str(weights))
        tensors["surprise"] = torch.zeros(2)
        save_file(tensors, str(weights))
    elif how == "config":
        meta = json.loads((path / ck.CONFIG).read_text())
        meta["model"]["d_model"] = 64
        (path / ck.CONFIG).write_text(json.dumps(meta))
    elif how == "version":
        meta = json.loads((path / ck.CONFIG).read_text())
        meta["format_version"] = 99
        (path / ck.CONFIG).write_text(json.dumps(meta))
    elif how == "kind":
        meta = json.loads((path / ck.CONFIG).read_text())
        meta["kind"] = "foo"
        (path / ck.CONFIG).write_text(json.dumps(meta))
    elif how in ("nan", "inf"):
        tensors = load_file(str(weights))
        tensors["blocks.1.norm1.weight"][3] = float(how)
        save_file(tensors, str(weights))
    elif how in ("tokenizer", "training"):  # a section of the wrong type
        meta = json.loads((path / ck.CONFIG).read_text())
        meta[how] = "tokenizer.model" if how == "tokenizer" else ["fim"]
        (path / ck.CONFIG).write_text(json.dumps(meta))


EXPECT = {
    "truncated": "truncated or corrupt",
    "garbage": "truncated or corrupt",
    "shape": "'blocks.0.mlp.w2.weight' has shape (3, 3)",
    "missing": "'blocks.1.norm1.weight' is missing",
    "extra": "unexpected tensor 'surprise'",
    "config": "has shape",
    "version": "format_version 99",
    "tokenizer": "its 'tokenizer' section is not",
    "training": "its 'training' section is not a mapping",
    "kind": "its kind 'foo' is not one of",
    "nan": "'blocks.1.norm1.weight' holds 1 NaN or infinite values",
    "inf": "'blocks.1.norm1.weight' holds 1 NaN or infinite values",
}


@pytest.mark.parametrize("how", list(EXPECT))
def test_bad_checkpoints_are_refused_in_one_line(
    how: str, tmp_path: Path, tokenizer: Tokenizer, specials: Specials
) -> None:
    path = ck.save_checkpoint(tmp_path / "c", trained_like("decoder", tokenizer), specials, tokenizer)
    corrupt(path, how)
    with pytest.raises(UserError, match=re.escape(EXPECT[how])) as info:
        ck.load_checkpoint(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("how", ["truncated", "shape"])
def test_cli_exits_2_with_one_line(
    how: str, tmp_path: Path, tokenizer: Tokenizer, specials: Specials
) -> None:
    path = ck.save_checkpoint(tmp_path / "c", trained_like("decoder", tokenizer), specials, tokenizer)
    corrupt(path, how)
    proc = subprocess.run(
        [sys.executable, "-m", "objtrain", "generate", str(path), "--prompt", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in proc.stderr


def test_run_directory_conventions(tmp_path: Path, tokenizer: Tokenizer, specials: Specials) -> None:
    model = trained_like("decoder", tokenizer)
    run = tmp_path / "run"
    ck.save_checkpoint(run / "checkpoint", model, specials, tokenizer)
    assert ck.resolve_checkpoint(run) == run / "checkpoint"
    ck.save_checkpoint(run / "checkpoints" / "step-2", model, specials, tokenizer)
    ck.mark_latest(run, "step-2")
    assert ck.resolve_checkpoint(run) == run / "checkpoints" / "step-2"
    ck.mark_latest(run, "step-9")
    with pytest.raises(UserError, match="step-9"):
        ck.resolve_checkpoint(run)
    with pytest.raises(UserError, match="neither a checkpoint"):
        ck.resolve_checkpoint(tmp_path)
    # no `latest` (killed before its first write): the highest step, by number
    (run / "checkpoints" / "latest").unlink()
    shutil.rmtree(run / "checkpoint")
    ck.save_checkpoint(run / "checkpoints" / "step-10", model, specials, tokenizer)
    assert ck.resolve_checkpoint(run) == run / "checkpoints" / "step-10"
    # a damaged `latest` (not UTF-8, or empty) is read past to the newest step-N
    for damaged in (b"\xff\xfe step", b""):
        (run / "checkpoints" / "latest").write_bytes(damaged)
        assert ck.resolve_checkpoint(run) == run / "checkpoints" / "step-10"


def invoke(*args: str) -> dict:
    result = CliRunner().invoke(app, ["generate", *args, "--format", "json"])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_cli_generate_modes(tmp_path: Path, tokenizer: Tokenizer, specials: Specials) -> None:
    dec = ck.save_checkpoint(
        tmp_path / "dec",
        trained_like("decoder", tokenizer, mtp_heads=3),
        specials,
        tokenizer,
        {"objective": "fim", "fim_mode": "spm"},
    )
    out = invoke(str(dec), "--prompt", "def f(x):", "--max-new-tokens", "12")
    assert (
        out["mode"] == "continue" and out["text"] == tokenizer.decode(out["tokens"]) and out["n_tokens"] <= 12
    )
    spec = invoke(str(dec), "--prompt", "def f(x):", "--max-new-tokens", "12", "--speculative")
    assert spec["tokens"] == out["tokens"]
    fim = invoke(str(dec), "--prefix", "def f(x):\n", "--suffix", "\n    return y", "-n", "8")
    assert fim["mode"] == "fim-spm"  # the checkpoint's recorded mode
    assert (
        invoke(str(dec), "--prefix", "a", "--suffix", "b", "-n", "4", "--fim-mode", "psm")["mode"]
        == "fim-psm"
    )
    sample_args = ("--prompt", "x", "-n", "10", "--temperature", "1.0", "--top-p", "0.9", "--seed", "3")
    assert invoke(str(dec), *sample_args)["tokens"] == invoke(str(dec), *sample_args)["tokens"]
    spm_trained = ck.save_checkpoint(
        tmp_path / "spm",
        trained_like("decoder", tokenizer),
        specials,
        tokenizer,
        {"objective": "fim", "objective_config": {"fim_rate": 0.9, "spm_rate": 1.0}},
    )
    assert invoke(str(spm_trained), "--prefix", "a", "--suffix", "b", "-n", "2")["mode"] == "fim-spm"

    enc = ck.save_checkpoint(tmp_path / "enc", trained_like("encoder", tokenizer), specials, tokenizer)
    masked = invoke(str(enc), "--text", "def [MASK](x):", "--top-k", "3")
    assert masked["mode"] == "fill-mask" and len(masked["masks"]) == 1 and len(masked["masks"][0]) == 3

    ed = ck.save_checkpoint(tmp_path / "ed", trained_like("encdec", tokenizer), specials, tokenizer)
    spans = invoke(str(ed), "--text", "def [MASK](x):\n    return [MASK]", "-n", "10")
    assert spans["mode"] == "span-fill" and len(spans["spans"]) == 2


def test_cli_rejects_wrong_mode_for_model(tmp_path: Path, tokenizer: Tokenizer, specials: Specials) -> None:
    enc = ck.save_checkpoint(tmp_path / "enc", trained_like("encoder", tokenizer), specials, tokenizer)
    result = CliRunner().invoke(app, ["generate", str(enc), "--prompt", "x"])
    assert isinstance(result.exception, UserError) and "--text" in str(result.exception)
    dec = ck.save_checkpoint(tmp_path / "dec", trained_like("decoder", tokenizer), specials, tokenizer)
    result = CliRunner().invoke(app, ["generate", str(dec), "--prompt", "x", "--speculative"])
    assert isinstance(result.exception, UserError) and "MTP" in str(result.exception)
