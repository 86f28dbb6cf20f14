"""`objtrain eval` end to end on debug checkpoints: what each model kind reports, known answers through
the command line, and one clear line with exit code 2 for every bad input."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from objtrain.data.pack import PackConfig, pack_store
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer

CODE = '''def first(items):
    """The first item."""
    for item in items:
        return item
    return None


def total(values, start=0):
    result = start
    for value in values:
        result += value
    return result
'''

Result = tuple[int, str, str]


@pytest.fixture
def cli(objtrain_cli: Callable[..., Result]) -> Callable[..., Result]:
    return lambda *args: objtrain_cli("eval", *args)


@pytest.fixture
def code_file(tmp_path: Path) -> Path:
    path = tmp_path / "code.py"
    path.write_text(CODE, encoding="utf-8")
    return path


@pytest.fixture
def probe_files(tmp_path: Path) -> tuple[Path, Path]:
    words = {"1": ["good", "fine", "great", "nice"], "0": ["bad", "dull", "poor", "awful"]}
    lines = [f"{label} a {w} film {i}" for i in range(6) for label, ws in words.items() for w in ws]
    (tmp_path / "train.txt").write_text("\n".join(lines[:32]) + "\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("\n".join(lines[32:]) + "\n", encoding="utf-8")
    return tmp_path / "train.txt", tmp_path / "dev.txt"


def _json(result: Result) -> dict:
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


def test_uniform_model_bits_per_byte_is_log2_v_times_tokens_over_bytes(
    cli, debug_checkpoint, code_file, tokenizer
):
    ckpt = debug_checkpoint("decoder", zero=True)
    out = _json(cli(ckpt, "--data", code_file, "--format", "json", "--skip", "corrupted,infill,probe,samples",
                    "--window", "16", "--stride", "5", "--word-ppl"))  # fmt: skip
    T, B, W = len(tokenizer.encode(CODE)), len(CODE.encode("utf-8")), len(CODE.split())
    assert out["scored_tokens"] == T and out["scored_bytes"] == B
    assert out["bits_per_byte"] == pytest.approx(math.log2(tokenizer.vocab_size) * T / B, rel=1e-6)
    assert out["loss"] == pytest.approx(math.log(tokenizer.vocab_size), rel=1e-6)
    assert out["word_perplexity"] == pytest.approx(2 ** (out["bits_per_byte"] * B / W), rel=1e-6)
    assert out["byte_perplexity"] == pytest.approx(2 ** out["bits_per_byte"], rel=1e-9)


def test_fim_decoder_reports_every_part(cli, debug_checkpoint, code_file, probe_files):
    training = {"objective": "fim", "objective_config": {"fim_rate": 0.5}, "fim_mode": "psm", "seq_len": 64}
    ckpt = debug_checkpoint("decoder", training)
    args = (ckpt, "--data", code_file, "--probe", probe_files[0], "--probe-valid", probe_files[1],
            "--infill-tasks", "2", "--infill-max-tokens", "8", "--samples", "1",
            "--corrupt-rows", "4")  # fmt: skip
    out = _json(cli(*args, "--format", "json"))
    for key in (
        "bits_per_byte",
        "objective_loss",
        "infill_exact_match",
        "infill_parse_rate",
        "probe_accuracy",
    ):
        assert isinstance(out[key], float) and math.isfinite(out[key]), key
    assert out["infill_mode"] == "fim-psm" and out["infill_tasks"] == 2 and out["window"] == 64
    assert out["probe_classes"] == 2 and "probe_mcc" in out and out["samples"]
    code, text, err = cli(*args)
    assert code == 0, err
    assert "bits_per_byte" in text and "infill_parse_rate" in text and "probe_accuracy" in text


def test_encoder_and_encdec_get_their_own_scores(cli, debug_checkpoint, code_file, probe_files):
    enc = _json(cli(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32}), "--data", code_file,
                    "--format", "json", "--probe", probe_files[0], "--probe-pooling", "pooled",
                    "--corrupt-rows", "4",
                    "--samples", "1"))  # fmt: skip
    assert "bits_per_byte" not in enc and "infill_exact_match" not in enc
    assert 0.0 <= enc["masked_accuracy"] <= 1.0 and enc["masked_loss"] > 0 and "objective_loss" in enc
    assert enc["samples"][0]["mode"] == "fill-mask"
    assert enc["probe_pooling"] == "pooled" and enc["probe_feature_dim"] == 32
    encdec = _json(cli(debug_checkpoint("encdec", {"objective": "span", "seq_len": 96}), "--data", code_file,
                       "--format", "json", "--skip", "probe", "--infill-tasks", "2",
                       "--infill-max-tokens", "8", "--corrupt-rows", "4", "--samples", "1"))  # fmt: skip
    assert encdec["span_target_loss"] > 0 and encdec["bits_per_byte"] > 0
    assert encdec["infill_mode"] == "sentinel" and encdec["infill_tasks"] == 2


def _code_store(tmp_path: Path, texts: list[str], tokenizer: Tokenizer) -> Path:
    """TMP/store: `texts` as modules, split at blank lines, a fifth of the documents held out as valid."""
    (tmp_path / "corpus").mkdir()
    for i, text in enumerate(texts):
        (tmp_path / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(tokenizer.model_proto)
    config = TokenizeConfig(tokenizer=tmp_path / "tok.model", doc_split="blank-line", valid_fraction=0.2)
    tokenize_corpus([tmp_path / "corpus"], tmp_path / "store", config)
    return tmp_path / "store"


def test_a_token_store_is_scored_on_its_valid_split(cli, debug_checkpoint, tmp_path, stdlib_texts, tokenizer):
    _code_store(tmp_path, stdlib_texts[:3], tokenizer)
    ckpt = debug_checkpoint("decoder", zero=True)
    out = _json(
        cli(ckpt, "--data", tmp_path / "store", "--format", "json", "--skip", "corrupted,infill,probe")
    )
    meta = json.loads((tmp_path / "store" / "meta.json").read_text())
    valid = meta["splits"]["valid"]
    assert out["scored_tokens"] == valid["tokens"] and out["scored_bytes"] == valid["bytes"]
    assert out["documents"] == valid["documents"]
    # a packed store cuts documents into row pieces; every byte is still scored once
    pack_store(tmp_path / "store", tmp_path / "packed", PackConfig(seq_len=64, mode="concat"))
    packed = _json(
        cli(ckpt, "--data", tmp_path / "packed", "--format", "json", "--skip", "corrupted,infill,probe")
    )
    assert packed["scored_bytes"] == valid["bytes"] and packed["documents"] > valid["documents"]
    assert packed["bits_per_byte"] == pytest.approx(out["bits_per_byte"], rel=1e-6)  # uniform: per token


def _refused(result: Result, fragment: str) -> None:
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert fragment in lines[0] and "Traceback" not in err


def test_bad_inputs_are_one_line_and_exit_2(cli, debug_checkpoint, tmp_path, code_file, probe_files):
    ckpt = debug_checkpoint("decoder")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "nolabel.jsonl").write_text('{"text": "no label"}\n')
    _refused(cli(ckpt, "--data", tmp_path / "empty.txt"), "empty")
    _refused(cli(ckpt, "--data", tmp_path / "latin1.txt"), "not UTF-8")
    _refused(cli(ckpt, "--data", code_file, "--probe", tmp_path / "nolabel.jsonl"), "label")
    probe = ("--data", code_file, "--skip", "lm,corrupted,infill,samples", "--probe", probe_files[0])
    _refused(cli(ckpt, *probe, "--probe-valid", tmp_path), "is a directory, not a file")
    _refused(cli(ckpt, *probe, "--probe-valid", tmp_path / "empty.txt"), "is empty")
    _refused(cli(ckpt, *probe, "--probe-valid", tmp_path / "latin1.txt"), "is not UTF-8 text (invalid byte")
    _refused(cli(tmp_path / "nowhere", "--data", code_file), "no checkpoint or run directory")
    _refused(cli(ckpt, "--data", tmp_path / "missing.txt"), "not found")
    _refused(cli(ckpt, "--data", code_file, "--stride", "1000", "--window", "8"), "--stride")
    _refused(cli(ckpt, "--data", code_file, "--skip", "everything"), "not a part")
    pooled = ("--probe", probe_files[0], "--probe-pooling", "pooled", "--skip", "lm,corrupted,infill")
    _refused(cli(ckpt, "--data", code_file, *pooled), "pooled head")
    (ckpt / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    _refused(cli(ckpt, "--data", code_file), "safetensors")
    (ckpt / "config.json").write_text("{not json")
    _refused(cli(ckpt, "--data", code_file), "not valid JSON")


def test_a_huge_window_scores_like_a_window_of_the_document(cli, debug_checkpoint, code_file, tokenizer):
    ckpt = debug_checkpoint("decoder", {"objective": "clm", "seq_len": 32})
    n = len(tokenizer.encode(CODE))
    args = (
        ckpt,
        "--data",
        code_file,
        "--format",
        "json",
        "--skip",
        "infill,probe,samples",
        "--corrupt-rows",
        "2",
    )
    exact = _json(cli(*args, "--window", n))
    huge = _json(cli(*args, "--window", 100_000))
    assert huge["windows"] == exact["windows"] == 1 and huge["window"] == 100_000
    assert huge["bits_per_byte"] == pytest.approx(exact["bits_per_byte"], rel=1e-6)
    assert huge["objective_loss"] == exact["objective_loss"]  # corruptions read training-length rows


def test_zero_sizes_and_missing_splits_are_refused(cli, debug_checkpoint, code_file, tmp_path, stdlib_texts,
                                                    tokenizer):  # fmt: skip
    ckpt = debug_checkpoint("decoder")
    _refused(cli(ckpt, "--data", code_file, "--window", "0"), "--window must be at least 1, got 0")
    _refused(cli(ckpt, "--data", code_file, "--stride", "0"), "--stride must be at least 1, got 0")
    _refused(cli(ckpt, "--data", code_file, "--max-docs", "-1"), "--max-docs must be at least 1, got -1")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "m.py").write_text(stdlib_texts[0], encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(tokenizer.model_proto)
    config = TokenizeConfig(tokenizer=tmp_path / "tok.model", valid_fraction=0.0)
    tokenize_corpus([tmp_path / "corpus"], tmp_path / "store", config)
    _refused(cli(ckpt, "--data", tmp_path / "store", "--split", "test"), "'test' split does not exist")
    _refused(cli(ckpt, "--data", tmp_path / "store", "--split", "test"), "splits with documents: train")
    _refused(cli(ckpt, "--data", tmp_path / "store"), "--split train or --data")


def test_a_store_token_past_the_vocabulary_is_refused(
    cli, debug_checkpoint, tmp_path, stdlib_texts, tokenizer
):
    _code_store(tmp_path, stdlib_texts[:3], tokenizer)
    dtype = np.dtype(json.loads((tmp_path / "store" / "meta.json").read_text())["dtype"])
    tokens = np.memmap(tmp_path / "store" / "valid.bin", dtype=dtype, mode="r+")
    tokens[3] = np.iinfo(dtype).max
    tokens.flush()
    del tokens
    ckpt = debug_checkpoint("decoder")
    _refused(cli(ckpt, "--data", tmp_path / "store"), f"holds token id {np.iinfo(dtype).max}, outside")


def test_a_damaged_training_record_is_refused_or_skipped(cli, debug_checkpoint, code_file):
    skip = ("--data", code_file, "--skip", "infill,probe,samples", "--corrupt-rows", "2")
    _refused(cli(debug_checkpoint("decoder", {"seq_len": "abc"}), *skip), "training seq_len of 'abc'")
    _refused(cli(debug_checkpoint("decoder", {"seq_len": -5}), *skip), "not a positive length")
    # an objective recorded wrongly costs its own loss only: the rest of the suite still runs
    for training in ({"objective": 5}, {"objective": "fim", "objective_config": [1]}):
        out = _json(cli(debug_checkpoint("decoder", training), *skip, "--format", "json"))
        assert "objective_loss" not in out and "objective_loss_skipped" in out and "bits_per_byte" in out


def test_a_run_whose_config_yaml_is_damaged_asks_for_data(cli, debug_checkpoint, tmp_path):
    ckpt = debug_checkpoint("decoder")
    (ckpt.parent / "config.yaml").write_text("data: [\n")  # the run directory holding the checkpoint
    _refused(cli(ckpt), "config.yaml cannot be read for the run's store: pass --data")


def test_infill_kinds_take_what_help_and_errors_offer(cli, debug_checkpoint, code_file):
    from objtrain.evaluation.suite import EvalOptions

    for given, kinds in [(("both",), ("line", "span")), (("span", "both"), ("span", "line"))]:
        assert EvalOptions(infill_kinds=given).infill_kinds == kinds
    assert EvalOptions(infill_kinds=("line",)).infill_kinds == ("line",)
    ckpt = debug_checkpoint("decoder", {"objective": "fim", "fim_mode": "psm", "seq_len": 64})
    args = (ckpt, "--data", code_file, "--skip", "lm,corrupted,probe,samples", "--infill-tasks", "1")
    out = _json(cli(*args, "--infill-kinds", "both", "--infill-max-tokens", "2", "--format", "json"))
    assert out["infill_tasks"] == 1
    _refused(
        cli(*args, "--infill-kinds", "rows"),
        "--infill-kinds must be line, lines, span, both or all, got 'rows'",
    )
    code, help_text, _ = cli("--help")
    assert code == 0 and "(2-6 lines)" in " ".join(help_text.split())


def test_the_table_heading_is_one_line() -> None:
    from rich.console import Console

    from objtrain.cli.evaluate import print_result

    console = Console(record=True, width=80)
    result = {"checkpoint": "runs/a[i]/checkpoints/step-00000929", "model_kind": "decoder"}
    result.update({"objective": "mtp", "train_step": 929, "loss": 2.5, "bits_per_byte": 1.25, "seconds": 0.5})
    print_result(console, result)
    lines = console.export_text().splitlines()
    assert lines[0] == "runs/a[i]/checkpoints/step-00000929: decoder, mtp, step 929", lines[:2]
