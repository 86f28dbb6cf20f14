"""Every README example marked for testing runs as written, so the README cannot drift from the code.

The marker: an HTML comment `<!-- test -->` on the line just before a fenced block (```bash or ```python).
Marked blocks run in README order, from a scratch directory laid out like the repository root (`data/`,
`configs/` and `.venv` linked in), each in a fresh bash whose PATH holds only the system directories
(`os.defpath`) and that is prepared only by the README's `<!-- test: setup -->` block (activating `.venv`),
as a new user's shell would be: an example that needs a step the README does not state fails here. A
bash block runs under `set -euo pipefail`, a python block through the `python` the setup put on PATH;
each must exit 0 without a traceback. Blocks without the marker are illustrations
(placeholders such as STORE, GPU or multi-node commands). A marked block that uses `../shared` is skipped,
with the reason shown, where ../shared is absent (a user's clone has none). Keep marked examples quick:
small corpora, debug-size models, a few steps.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = "<!-- test -->"
SETUP = "<!-- test: setup -->"
SHARED = ROOT.parent / "shared"


def marked_blocks(text: str, marker: str = MARKER) -> list[tuple[int, str, str]]:
    """(line number of the fence, language, code) of every block right after `marker`."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines[:-1]):
        if line.strip() != marker:
            continue
        fence = lines[i + 1].strip()
        match = re.fullmatch(r"```(bash|python)", fence)
        assert match, f"README line {i + 1}: {marker} must be followed by a ```bash or ```python fence"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        blocks.append((i + 2, match.group(1), "\n".join(lines[i + 2 : end]) + "\n"))
    return blocks


BLOCKS = marked_blocks(README.read_text(encoding="utf-8"))
SETUP_BLOCKS = marked_blocks(README.read_text(encoding="utf-8"), SETUP)


def test_the_readme_has_marked_examples() -> None:
    assert len(BLOCKS) >= 5
    assert {lang for _, lang, _ in BLOCKS} == {"bash", "python"}


def _venv() -> Path:
    """The environment `make install` built, as the README's `.venv`: the one running these tests (make
    test runs them with .venv/bin/python), else the repository's own."""
    return Path(sys.prefix) if sys.prefix != sys.base_prefix else ROOT / ".venv"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = _venv()
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"the README's examples need the .venv that `make install` builds; {venv} is not one")
    work = tmp_path_factory.mktemp("readme")
    (work / "data").symlink_to(ROOT / "data")
    (work / "configs").symlink_to(ROOT / "objtrain" / "configs")
    (work / ".venv").symlink_to(venv)
    return work


def _bare_env() -> dict[str, str]:
    """A new user's shell: the system PATH only, no virtual environment active, no Python path."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.defpath
    env.pop("COLUMNS", None)
    return env


def _shell(code: str, lang: str) -> tuple[list[str], str | None]:
    """The bash command that prepares the shell as the README says, then runs `code`."""
    setup = "".join(block for _, _, block in SETUP_BLOCKS)
    if lang == "bash":
        return ["bash", "-c", f"set -euo pipefail\n{setup}{code}"], None
    return ["bash", "-c", f"set -euo pipefail\n{setup}python -"], code


def test_the_readme_says_how_objtrain_gets_on_path() -> None:
    """The setup the examples rely on is in the README, and nothing else puts objtrain on a bare PATH."""
    assert SETUP_BLOCKS, f"the README needs a {SETUP} block: how `objtrain` gets on PATH after make install"
    assert any("source .venv/bin/activate" in code for _, _, code in SETUP_BLOCKS)
    assert ".venv/bin/objtrain" in README.read_text(encoding="utf-8")
    done = subprocess.run(["bash", "-c", "command -v objtrain"], env=_bare_env(), capture_output=True)
    assert done.returncode != 0, (
        "objtrain is on the bare PATH: the README test would not notice a missing step"
    )


@pytest.mark.slow
@pytest.mark.parametrize(("line", "lang", "code"), BLOCKS, ids=[f"line-{b[0]}" for b in BLOCKS])
def test_readme_example(line: int, lang: str, code: str, workdir: Path) -> None:
    if "../shared" in code and not SHARED.is_dir():
        pytest.skip(f"README line {line}: needs ../shared, which is absent here (a user's clone has none)")
    args, stdin = _shell(code, lang)
    done = subprocess.run(
        args, cwd=workdir, env=_bare_env(), input=stdin, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"README line {line} failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, f"README line {line}:\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_examples_write_only_under_runs(workdir: Path) -> None:
    """Run after the examples (file order): they leave nothing outside runs/, which .gitignore covers."""
    names = sorted(p.name for p in workdir.iterdir())
    assert names in ([".venv", "configs", "data"], [".venv", "configs", "data", "runs"])
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()


def test_named_apis_import() -> None:
    """Every `objtrain.x.y` the README names exists: a module, or an attribute of one."""
    names = set(re.findall(r"`(objtrain(?:\.\w+)+)", README.read_text(encoding="utf-8")))
    assert names
    for name in sorted(names):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            module, _, attr = name.rpartition(".")
            assert hasattr(importlib.import_module(module), attr), (
                f"README names {name}, which does not exist"
            )
