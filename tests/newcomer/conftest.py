"""Fixtures for the newcomer checks: the real entry point in-process, a small token store."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # newcomer_helpers

from newcomer_helpers import Result

from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus


@pytest.fixture
def cli(objtrain_cli: Callable[..., Result]) -> Callable[..., Result]:
    """Run `objtrain ARGS` in-process through main(): (exit code, stdout, stderr)."""
    return objtrain_cli


@pytest.fixture(scope="session")
def small_store(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str]) -> Path:
    """A token store of a few standard-library modules with a 1,000-piece tokenizer."""
    root = tmp_path_factory.mktemp("newcomer")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, text in enumerate(stdlib_texts):
        (corpus / f"m{i}.py").write_text(text, encoding="utf-8")
    out = root / "store"
    tokenize_corpus([corpus], out, TokenizeConfig(vocab_size=1000, valid_fraction=0.2))
    return out
