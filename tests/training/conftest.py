"""Fixtures for the training loop: a small token store of standard-library code (many short documents)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from objtrain.data.pack import PackConfig, pack_store
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.training.config import TrainConfig, build_config, merged


@pytest.fixture(scope="session")
def train_store(
    tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str], tokenizer: Tokenizer
) -> Path:
    """A token store split at blank lines (hundreds of documents, a valid split of about 10%)."""
    root = tmp_path_factory.mktemp("train")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts):
        (root / "corpus" / f"module{i}.py").write_bytes(text.encode("utf-8"))
    (root / "tok.model").write_bytes(tokenizer.model_proto)
    config = TokenizeConfig(tokenizer=root / "tok.model", doc_split="blank-line", valid_fraction=0.1)
    tokenize_corpus([root / "corpus"], root / "store", config)
    return root / "store"


@pytest.fixture(scope="session")
def packed_store(tmp_path_factory: pytest.TempPathFactory, train_store: Path) -> Path:
    out = tmp_path_factory.mktemp("packed") / "packed"
    pack_store(train_store, out, PackConfig(seq_len=64, mode="bestfit"))
    return out


def _small_config(store: Path, **sections: Any) -> TrainConfig:
    """A debug-size run: quick on 2 cores, every code path of the loop."""
    base: dict[str, Any] = {
        "data": {"store": str(store)},
        "model": {"size": "debug"},
        "objective": {"name": "clm"},
        "batch": {"seq_len": 64, "batch_size": 8},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup": 2},
        "budget": {"steps": 6},
        "validation": {"every": -1, "rows": 8},
        "logging": {"tensorboard": False, "sample": False},
        "precision": {"dtype": "fp32"},
        "device": "cpu",
        "workers": 0,
    }
    return build_config(merged(base, sections))


@pytest.fixture(scope="session")
def small_config() -> Callable[..., TrainConfig]:
    """`small_config(store, **sections)`: a debug-size run config, sections merged over the defaults."""
    return _small_config


@pytest.fixture
def poison_clm_loss(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], dict[str, int]]:
    """`poison_clm_loss(k)`: the causal LM's k-th loss call (counting from 1) returns NaN; the returned
    `{"n": calls}` counts the calls."""
    from objtrain.objectives.clm import CausalLM

    def poison(at: int) -> dict[str, int]:
        calls = {"n": 0}
        original = CausalLM.loss

        def poisoned(self, output, batch):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            out = original(self, output, batch)
            if calls["n"] == at:
                out.loss_sum = out.loss_sum * float("nan")
            return out

        monkeypatch.setattr(CausalLM, "loss", poisoned)
        return calls

    return poison
