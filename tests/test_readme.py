"""Every README example marked for testing runs as written, so the README cannot drift from the code.

The marker: an HTML comment `<!-- test -->` on the line just before a fenced block (```bash or ```python).
Marked blocks run in README order, from a scratch directory laid out like the repository root (`data/`
and `configs/` linked in), with the `objtrain` of this environment first on PATH; a bash block runs under
`set -euo pipefail` and must exit 0 without a traceback. Blocks without the marker are illustrations
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
SHARED = ROOT.parent / "shared"


def marked_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number of the fence, language, code) of every block right after the marker."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines[:-1]):
        if line.strip() != MARKER:
            continue
        fence = lines[i + 1].strip()
        match = re.fullmatch(r"```(bash|python)", fence)
        assert match, f"README line {i + 1}: {MARKER} must be followed by a ```bash or ```python fence"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        blocks.append((i + 2, match.group(1), "\n".join(lines[i + 2 : end]) + "\n"))
    return blocks


BLOCKS = marked_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_marked_examples() -> None:
    assert len(BLOCKS) >= 5
    assert {lang for _, lang, _ in BLOCKS} == {"bash", "python"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    (work / "data").symlink_to(ROOT / "data")
    (work / "configs").symlink_to(ROOT / "objtrain" / "configs")
    return work


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("COLUMNS", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize(("line", "lang", "code"), BLOCKS, ids=[f"line-{b[0]}" for b in BLOCKS])
def test_readme_example(line: int, lang: str, code: str, workdir: Path) -> None:
    if "../shared" in code and not SHARED.is_dir():
        pytest.skip(f"README line {line}: needs ../shared, which is absent here (a user's clone has none)")
    args = ["bash", "-c", "set -euo pipefail\n" + code] if lang == "bash" else [sys.executable, "-c", code]
    done = subprocess.run(args, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README line {line} failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, f"README line {line}:\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_examples_write_only_under_runs(workdir: Path) -> None:
    """Run after the examples (file order): they leave nothing outside runs/, which .gitignore covers."""
    assert sorted(p.name for p in workdir.iterdir()) in (["configs", "data"], ["configs", "data", "runs"])
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
