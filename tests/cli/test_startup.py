"""`objtrain --version` and `objtrain --help` answer without importing torch or `objtrain.compare`: the
commands' modules load only when a command runs or shows its own help (`objtrain/cli/__init__.py`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The executable's own path (`objtrain/__main__.py`), then what the process had imported once it answered.
PROBE = """
import json, sys
sys.argv = ["objtrain", *sys.argv[1:]]
from objtrain.__main__ import main
try:
    main()
except SystemExit as exc:
    code = exc.code
loaded = [m for m in sys.modules if m == "torch" or m.startswith("objtrain.compare")]
sys.stderr.write(json.dumps({"code": code, "loaded": loaded}) + "\\n")
"""


def _answer(*args: str) -> tuple[str, dict]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout, json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [("--version",), ("--help",), ()])
def test_version_and_help_import_neither_torch_nor_compare(args: tuple[str, ...]) -> None:
    out, seen = _answer(*args)
    assert seen["loaded"] == []
    if args == ("--version",):
        import platform

        import torch

        assert seen["code"] == 0
        import objtrain

        versions = f"torch {torch.__version__}, Python {platform.python_version()}"
        assert out.strip() == f"objtrain {objtrain.__version__} ({versions})"
    else:  # bare `objtrain` shows the same help, with click's exit 2 for a missing command
        from objtrain.cli import COMMANDS

        assert seen["code"] == (0 if args else 2)
        assert all(f" {name} " in out for name in COMMANDS)


def test_the_listed_help_is_each_commands_own() -> None:
    """`objtrain --help` lists each command by the first paragraph of its own help, as before it loaded
    lazily; and every command's module is named."""
    from objtrain.cli import COMMANDS, command

    root = command()
    assert list(root.commands) == list(COMMANDS)
    for name, (_, summary) in COMMANDS.items():
        assert root.commands[name].help.split("\n\n")[0] == summary


def test_a_command_loads_when_it_runs() -> None:
    out, seen = _answer("train", "--help")
    assert "--objective" in out and seen["code"] == 0
    assert "torch" in seen["loaded"]
