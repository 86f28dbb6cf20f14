"""The embedded default corpus: the Python standard library's own source as a token store, built once.

`objtrain train --objective fim` with no DATA trains on it, so a fresh install needs no files of the
user's. The store is cached under the user's cache directory (`$OBJTRAIN_CACHE`, else
`$XDG_CACHE_HOME/objtrain`, else `~/.cache/objtrain`), keyed by the Python version whose library it holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from objtrain.data.tokenize import Progress, TokenizeConfig, tokenize_corpus

VOCAB_SIZE = 4096


def cache_dir() -> Path:
    if os.environ.get("OBJTRAIN_CACHE"):
        return Path(os.environ["OBJTRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "objtrain"


def default_store_path() -> Path:
    return cache_dir() / f"stdlib-py{sys.version_info.major}{sys.version_info.minor}-v{VOCAB_SIZE}"


def default_store(progress: Progress | None = None) -> Path:
    """The cached standard-library token store, built (atomically) on first use."""
    path = default_store_path()
    if not (path / "meta.json").is_file():
        tokenize_corpus([], path, TokenizeConfig(corpus="stdlib", vocab_size=VOCAB_SIZE), progress=progress)
    return path
