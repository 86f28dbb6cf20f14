"""Bad input gets one line and exit 2 (never a traceback, never a wrong answer); CLI conventions."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from newcomer_helpers import Result, objtrain_cmd, run_objtrain, subprocess_env

import objtrain
from objtrain.data.store import TokenStore
from objtrain.data.tokenizer import Tokenizer
from objtrain.models.checkpoint import save_checkpoint
from objtrain.models.zoo import build_model, model_config

COMMANDS = ("tokenize", "pack", "corrupt", "train", "eval", "compare", "generate")


def refused(result: Result, *fragments: str) -> str:
    code, _, err = result
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_truncated_tokenizer_is_refused_when_the_store_opens(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "store"
    shutil.copytree(small_store, broken)
    model = broken / "tokenizer.model"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    refused(cli("pack", broken, "--seq-len", "64", "-o", tmp_path / "packed"), "tokenizer.model")
    assert not (tmp_path / "packed").exists()
    with pytest.raises(objtrain.errors.UserError):
        TokenStore.open(broken)


def test_corrupt_refuses_empty_text(cli: Callable[..., Result], small_store: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    refused(cli("corrupt", empty, "--tokenizer", small_store, "--objective", "mlm"), "holds no text")
    refused(cli("corrupt", "--text", "", "--tokenizer", small_store, "--objective", "mlm"), "--text is empty")


def test_unknown_objective_and_key_suggest(cli: Callable[..., Result], small_store: Path) -> None:
    refused(cli("corrupt", small_store, "--objective", "fmi"), "did you mean 'fim'?")
    refused(cli("corrupt", small_store, "--objective", "mlm", "mask_rate=0.2"), "did you mean 'mask_prob'?")
    code, out, err = cli("corrupt", small_store, "--objective", "SPAN", "--n", "1", "--format", "jsonl")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["objective"] == "span"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, overrides, info in [
        ("clm", {}, {"objective": "clm"}),
        ("fim", {}, {"objective": "fim", "fim_mode": "psm"}),
        ("mtp", {"mtp_heads": 3}, {"objective": "mtp"}),
    ]:
        torch.manual_seed(0)
        model = build_model(model_config("decoder", "debug", overrides, vocab_size=tokenizer.vocab_size))
        out[name] = save_checkpoint(root / name, model, tokenizer.specials, tokenizer, info)
    return out


def test_generate_refuses_what_the_checkpoint_cannot_do(
    cli: Callable[..., Result], checkpoints: dict[str, Path]
) -> None:
    err = refused(cli("generate", checkpoints["clm"], "--prefix", "def f(", "--suffix", "):"), "not fill-in")
    assert "--objective fim" in err
    code, out, err = cli("generate", checkpoints["clm"], "--prompt", "def f(x):", "--speculative", "-n", "4")
    assert code == 2 and out == "", (out, err)  # refused before the prompt is printed
    assert "MTP" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("generate", checkpoints["fim"], "--prefix", "def f(", "--suffix", "):", "-n", "3")
    assert code == 0, err
    code, _, err = cli("generate", checkpoints["mtp"], "--prompt", "x = ", "--speculative", "-n", "3")
    assert code == 0, err


def test_device_names_through_the_cli(cli: Callable[..., Result], checkpoints: dict[str, Path]) -> None:
    refused(cli("generate", checkpoints["clm"], "--prompt", "x", "--device", "tpu"), "unknown --device 'tpu'")
    if not torch.cuda.is_available():
        refused(cli("generate", checkpoints["clm"], "--prompt", "x", "--device", "cuda"), "--device cuda")
    code, out, err = cli("generate", checkpoints["clm"], "--prompt", "x", "-n", "2", "--device", "auto",
                         "--format", "json")  # fmt: skip
    assert code == 0 and json.loads(out)["n_tokens"] <= 2, err


def test_one_format_vocabulary(
    cli: Callable[..., Result], small_store: Path, checkpoints: dict[str, Path]
) -> None:
    base = ("corrupt", small_store, "--objective", "span", "--n", "3")
    code, out, _ = cli(*base, "--format", "jsonl")
    assert code == 0 and len(out.splitlines()) == 3
    code, out, _ = cli(*base, "--format", "json")
    assert code == 0 and len(json.loads(out)) == 3
    code, out, _ = cli(*base, "--format", "json", "--stats")
    assert code == 0 and json.loads(out)["rows"] == 3
    code, out, _ = cli(*base, "--format", "text")
    assert code == 0 and "row 0" in out
    for fmt in ("json", "jsonl"):
        code, out, err = cli("generate", checkpoints["clm"], "--prompt", "x", "-n", "2", "--format", fmt)
        assert code == 0 and json.loads(out)["mode"] == "continue", err
    code, out, _ = cli("generate", checkpoints["clm"], "--prompt", "x", "-n", "2", "--format", "text")
    assert code == 0 and out.startswith("x")
    refused(cli(*base, "--format", "jsn"), "did you mean 'json'?")
    refused(cli("generate", checkpoints["clm"], "--prompt", "x", "--format", "rich"), "text, json, jsonl")


def test_piped_output_is_not_wrapped(cli: Callable[..., Result]) -> None:
    code, out, _ = cli("corrupt", "--list")  # captured: not a terminal
    assert code == 0
    assert max(len(line) for line in out.splitlines()) > 100  # rich would have folded it at 80
    assert all(line.count("│") in (0, 5) for line in out.splitlines())  # no cell split over two lines


def test_a_closed_pipe_ends_quietly_with_exit_0(small_store: Path) -> None:
    # `objtrain corrupt ... | head -3`: far more text than a pipe buffer holds, reader gone after 3 lines.
    proc = subprocess.Popen(
        objtrain_cmd("corrupt", small_store, "--objective", "span", "--n", "64"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == "" and head[0].startswith("── row 0".encode())


def test_piped_tokenize_writes_nothing_to_stderr(tmp_path: Path) -> None:
    text = tmp_path / "in.txt"
    shutil.copy(Path(__import__("textwrap").__file__), text)
    done = run_objtrain("tokenize", text, "--vocab-size", "800", "--doc-split", "blank-line", "-o",
                        tmp_path / "s")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "token store" in done.stdout


def test_help_version_and_flags(cli: Callable[..., Result]) -> None:
    code, out, _ = cli("--version")
    assert code == 0 and out.startswith(f"objtrain {objtrain.__version__} (torch ")
    for command in COMMANDS:
        code, out, _ = cli(command, "--help")
        assert code == 0, command
        assert "<bool>" not in out, command
        if "not available yet" not in out.lower():  # placeholders have nothing to show yet
            assert "Example: objtrain " + command in " ".join(out.split()), command


README = Path(objtrain.__file__).parents[1] / "README.md"


def _readme_section(start: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(start) :]
    return section[: section.index("\n- **", 1) if start.startswith("- **") else section.index("\n## ", 1)]


def test_the_readme_says_what_the_commands_do(cli: Callable[..., Result]) -> None:
    from objtrain.objectives.registry import OBJECTIVES

    listed = set(re.findall(r"^\| `([a-z_0-9]+)` \|", _readme_section("## Objectives"), re.MULTILINE))
    assert listed == set(OBJECTIVES), set(OBJECTIVES) ^ listed
    formats = " ".join(_readme_section("- **Output formats**").split())
    named = re.search(r"print results \(([^)]*)\)", formats)
    with_format = set(re.findall(r"`(\w+)`", named.group(1) if named else ""))
    devices = set()
    for command in COMMANDS:
        code, out, _ = cli(command, "--help")
        flat = " ".join(out.split())
        assert code == 0 and f"`{command}`" in formats, command  # every command accounted for
        assert ("--format" in out) == (command in with_format), command
        assert flat.index("Example: objtrain") < flat.index("Options"), command  # as the README says
    for command in ("eval", "generate"):
        cmd = objtrain.cli.command().commands[command]
        devices |= {p.help for p in cmd.params if p.name == "device"}
    assert len(devices) == 1, devices  # one help text for --device
    refused(cli("eval", "x", "--format", "jsonl"), "--format must be one of text, json")


def test_installed_script_entry_is_the_light_module() -> None:
    # The console script imports objtrain.__main__ (standard library only) so Ctrl-C while torch loads
    # is caught; importing it must not pull in torch.
    done = subprocess.run(
        ["python3", "-c", "import sys, objtrain.__main__; print('torch' in sys.modules)"],
        capture_output=True, text=True, cwd=Path(objtrain.__file__).parents[1],
    )  # fmt: skip
    assert done.stdout.strip() == "False", done.stderr


def test_brackets_in_paths_and_model_text_are_printed_as_they_are(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    # rich reads `[i]` as italic and `[/]` as a closing tag: user and model text must reach the screen
    # escaped, or code loses its subscripts and an error line becomes a MarkupError traceback.
    missing = tmp_path / "x[/]notes[i].txt"
    refused(cli("corrupt", missing, "--tokenizer", small_store, "--objective", "mlm"), "x[/]notes[i].txt")

    from rich.console import Console

    from objtrain.cli.generate import _print_fill_mask
    from objtrain.report.comparison import _rich

    console = Console(record=True, width=200)
    text = "a[i] = b[/][lr]"
    _print_fill_mask(console, {"text": text, "masks": [[{"token": "[i]", "prob": 0.5}]]}, "text")
    shown = console.export_text()
    assert f"top-1: {text}" in shown and "'[i]'" in shown, shown
    console.print(_rich("[baseline]"), _rich("**[best]**"))
    assert "[baseline] [best]" in console.export_text()
