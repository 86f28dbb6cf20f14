"""Shared fixtures: a small tokenizer trained once per session on standard-library source.

The standard library is on every machine, so unit tests need nothing from outside the repository.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
from objtrain.specials import Specials

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SAMPLE_MODULES = ["textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "queue.py", "string.py"]


@pytest.fixture(scope="session")
def stdlib_texts() -> list[str]:
    """A few real standard-library modules as documents (about 150 KB of Python)."""
    return [(STDLIB / name).read_text(encoding="utf-8") for name in SAMPLE_MODULES]


@pytest.fixture(scope="session")
def specials() -> Specials:
    return Specials()


@pytest.fixture(scope="session")
def tokenizer(stdlib_texts: list[str], specials: Specials) -> Tokenizer:
    lines = [line for text in stdlib_texts for line in text.splitlines(keepends=True)]
    proto = train_sentencepiece(lines, vocab_size=1200, model_type="unigram", specials=specials)
    return Tokenizer(proto, specials)
