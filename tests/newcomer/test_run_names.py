"""Where a run goes when -o is not given, as --help says (runs/OBJECTIVE-KIND-SIZE), and the README's
examples that read a run (eval, generate, export) name one that an example trains, by -o or by that
default: a newcomer who follows them in order finds the run."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from newcomer_helpers import Result

from objtrain.cli.train import default_run_dir
from objtrain.training.config import build_config

README = Path(__file__).resolve().parents[2] / "README.md"
QUIET = ("validation.every=-1", "logging.sample=false", "workers=0", "--seq-len", "32", "--batch-size", "2")


def default_for(args: list[str]) -> Path:
    """The run directory `objtrain train ARGS` (no -o) writes, from its flags."""
    flags = dict(zip(args, [*args[1:], ""], strict=True))
    model: dict[str, str] = {}
    if "--model-kind" in flags:
        model["kind"] = flags["--model-kind"]
    if "--model" in flags:
        model["size"] = flags["--model"]
    objective = flags.get("--objective", flags.get("-O"))
    return default_run_dir(build_config({"objective": {"name": objective}, "model": model}))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--objective", "fim"], "runs/fim-decoder-tiny"),
        (["--objective", "SPAN"], "runs/span-encdec-tiny"),  # the objective's first kind, by its name
        (["--objective", "span", "--model-kind", "decoder", "--model", "debug"], "runs/span-decoder-debug"),
        (["--objective", "mlm", "--model", "small"], "runs/mlm-encoder-small"),
    ],
)
def test_the_default_run_directory_is_objective_kind_size(args: list[str], expected: str) -> None:
    assert default_for(args) == Path(expected)


def test_train_without_o_writes_where_help_says(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = cli("train", "--help")
    assert code == 0 and "runs/OBJECTIVE-KIND-SIZE" in out
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("train", small_store, "--objective", "clm", "--model", "debug", "--steps", "1", *QUIET)
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["clm-decoder-debug"]
    assert (tmp_path / "runs" / "clm-decoder-debug" / "checkpoints" / "latest").is_file()


def _commands() -> list[list[str]]:
    """Every `objtrain ...` command in the README's bash blocks, split as bash would (comments dropped,
    continued lines joined)."""
    text = README.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "objtrain" in words:
                commands.append(words[words.index("objtrain") + 1 :])
    return commands


def test_the_readmes_examples_read_runs_that_its_examples_train() -> None:
    trained: set[str] = set()
    read: list[str] = []
    for words in _commands():
        if not words:
            continue
        if words[0] == "train":
            args = words[1:]
            out = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-o", "--output")), None)
            trained.add(out if out is not None else str(default_for(args)))
        elif words[0] in ("eval", "generate", "export") and len(words) > 1 and words[1].startswith("runs/"):
            read.append(words[1])
    assert "runs/fim-decoder-tiny" in trained and read  # the parse found the examples
    missing = sorted({run for run in read if run not in trained and not run.startswith("runs/demo/")})
    assert missing == [], f"README examples read runs no example trains: {missing}"
