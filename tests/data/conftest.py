"""Fixtures for the data path: the session tokenizer as a .model file, and a small corpus directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from objtrain.data.tokenizer import Tokenizer

# Text a tokenizer must keep byte for byte: indentation, tabs, repeated spaces, blank lines, \r\n, a lone \r,
# trailing whitespace, sentencepiece's own word-start mark, combining marks, astral-plane characters.
TRICKY = "def f(x):\n\tif x:\n\t\treturn  'ünï 日本 🎉'  \n\n\n\r\n   end\t\r ▁word ▁▁ e\u0301 \U0001f600\n"


@pytest.fixture(scope="session")
def tricky() -> str:
    return TRICKY


@pytest.fixture(scope="session")
def model_file(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("model") / "tok.model"
    path.write_bytes(tokenizer.model_proto)
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str]) -> Path:
    """Standard-library modules in a small tree, written as bytes so nothing is translated."""
    root = tmp_path_factory.mktemp("corpus")
    for i, text in enumerate(stdlib_texts):
        sub = root / ("pkg" if i % 2 else "") / f"module{i}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_bytes(text.encode("utf-8"))
    (root / "tricky.txt").write_bytes(TRICKY.encode("utf-8"))
    return root
