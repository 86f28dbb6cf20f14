"""Shared fixtures: a small tokenizer trained once per session on standard-library source.

The standard library is on every machine, so unit tests need nothing from outside the repository.
"""

from __future__ import annotations

import gc
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from objtrain.data.pack import PackConfig, pack_store
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
from objtrain.specials import Specials

# Property tests draw the same examples on every run, so a failure is one every machine sees and CI does
# not pass or fail on a draw. HYPOTHESIS_PROFILE=explore searches with fresh random examples instead.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SAMPLE_MODULES = ["textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "queue.py", "string.py"]


@pytest.fixture(autouse=True)
def fresh_probe_baselines() -> Iterator[None]:
    """Probe baselines are fitted once a process (`evaluation.suite._BASELINES`): each test starts without
    any, so none sees another's fits."""
    from objtrain.evaluation import suite

    suite._BASELINES.clear()
    yield
    suite._BASELINES.clear()


@pytest.fixture(autouse=True)
def no_loader_worker_left() -> Iterator[None]:
    """A test that leaves loader worker processes running fails, naming itself, instead of the whole suite
    hanging at exit or the workers slowing every later test."""
    from objtrain.data.loader import _WORKERS

    before = {id(w) for w in _WORKERS if w.is_alive()}
    yield
    left = [w for w in _WORKERS if w.is_alive() and id(w) not in before]
    if left:
        gc.collect()  # a dropped iterator shuts its workers down when collected
        left = [w for w in left if w.is_alive()]
    for worker in left:
        worker.kill()
        worker.join(timeout=5)
    assert not left, f"{len(left)} loader worker process(es) left running"


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


@pytest.fixture
def objtrain_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple]:
    """`objtrain ARGS` in-process through main(), the real entry point: (exit code, stdout, stderr)."""
    from objtrain.cli import main

    def run(*args: object) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["objtrain", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(autouse=True, scope="session")
def precision_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`--dtype auto` on a CPU caches what it measured (`training.precision`): the tests' runs, in process or
    not, keep theirs in a folder of the session's, never in the user's cache."""
    previous = os.environ.get("OBJTRAIN_PRECISION_CACHE")
    os.environ["OBJTRAIN_PRECISION_CACHE"] = str(tmp_path_factory.mktemp("precision") / "precision.json")
    yield
    if previous is None:
        os.environ.pop("OBJTRAIN_PRECISION_CACHE", None)
    else:
        os.environ["OBJTRAIN_PRECISION_CACHE"] = previous


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
