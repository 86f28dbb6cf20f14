"""Fixtures for `objtrain compare`: a tiny standard-library store and debug-size experiments."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))  # compare_helpers, shared by the test modules
sys.path.append(str(Path(__file__).resolve().parents[2]))  # scripts.findings, the repository's own

from compare_helpers import experiment

from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def compare_store(
    tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str], tokenizer: Tokenizer
) -> Path:
    """A token store of a few standard-library modules split at blank lines, with a valid split."""
    root = tmp_path_factory.mktemp("compare")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts[:4]):
        (root / "corpus" / f"module{i}.py").write_bytes(text.encode("utf-8"))
    (root / "tok.model").write_bytes(tokenizer.model_proto)
    config = TokenizeConfig(tokenizer=root / "tok.model", doc_split="blank-line", valid_fraction=0.1)
    tokenize_corpus([root / "corpus"], root / "store", config)
    return root / "store"


@pytest.fixture()
def write_experiment(tmp_path: Path, compare_store: Path) -> Callable[..., Path]:
    """`write_experiment(arms=None, **top) -> path`: the debug experiment as YAML in tmp_path."""

    def write(arms: list[dict[str, Any]] | None = None, name: str = "exp.yaml", **top: Any) -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(experiment(compare_store, arms, **top)), encoding="utf-8")
        return path

    return write
