"""Weights & Biases logging (`logging.wandb`): offline, with no network or account, the run gets every
metrics.jsonl record. wandb is an optional extra outside the dev extra: these tests skip without it,
except the one that checks a missing package is one clear error."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer

Cli = Callable[..., tuple[int, str, str]]
WANDB = "logging.wandb={project: objtrain-test, mode: offline}"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str], tokenizer: Tokenizer) -> Path:
    root = tmp_path_factory.mktemp("wandb")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts[:3]):
        (root / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    (root / "tok.model").write_bytes(tokenizer.model_proto)
    cfg = TokenizeConfig(tokenizer=root / "tok.model", doc_split="blank-line", valid_fraction=0.1)
    tokenize_corpus([root / "corpus"], root / "store", cfg)
    return root / "store"


def history(run_file: Path) -> dict[int, dict[str, Any]]:
    """step -> logged values, read from a run's .wandb file: W&B's 7-byte header, then LevelDB-log
    records (32 KiB blocks, chunks of crc32, length, type) holding protobuf `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, out = 32768, 7, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            if record.WhichOneof("record_type") == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                }
                out.setdefault(record.history.step.num, {}).update(items)
    return out


def test_offline_run_mirrors_metrics_jsonl(
    store: Path, tmp_path: Path, objtrain_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(
        "wandb", reason="wandb not installed (pip install 'objtrain[wandb]'; not in the dev extra)"
    )
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing outside tmp_path
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_API_KEY", "")  # no account
    run = tmp_path / "run"
    code, _, err = objtrain_cli(
        "train", store, "--objective", "clm", "--model", "debug", "--seq-len", "64", "--steps", "3",
        "-o", run, WANDB, "logging.sample=false", "logging.tensorboard=false",
    )  # fmt: skip
    assert code == 0, err
    (offline,) = (run / "wandb").glob("offline-run-*")
    metrics = (run / "metrics.jsonl").read_text()
    assert (offline / "files" / "metrics.jsonl").read_text() == metrics  # every record, whole
    logged = history(next(offline.glob("*.wandb")))
    records = [json.loads(line) for line in metrics.splitlines()]
    train = [r for r in records if "loss" in r and "split" not in r]
    valid = [r for r in records if r.get("split") == "val"]
    assert [r["step"] for r in train] == [1, 2, 3] and valid
    for r in train:
        assert logged[r["step"]]["loss"] == pytest.approx(r["loss"], rel=1e-12)
        assert logged[r["step"]]["lr"] == pytest.approx(r["lr"], rel=1e-12)
    for r in valid:
        assert logged[r["step"]]["val_loss"] == pytest.approx(r["val_loss"], rel=1e-12)


def test_without_the_package_a_wandb_config_is_one_clear_error(
    store: Path, tmp_path: Path, objtrain_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as if it were not installed
    code, _, err = objtrain_cli(
        "train",
        store,
        "--objective",
        "clm",
        "--model",
        "debug",
        "--steps",
        "1",
        "-o",
        tmp_path / "run",
        WANDB,
    )
    assert code == 2 and "pip install 'objtrain[wandb]'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
