"""What the newcomer checks share: the real entry point in a subprocess (`python -m objtrain`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

Result = tuple[int, str, str]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("COLUMNS", None)
    return env


def objtrain_cmd(*args: object) -> list[str]:
    """`python -m objtrain ARGS`: the same main() as the installed `objtrain` script."""
    return [sys.executable, "-m", "objtrain", *map(str, args)]


def run_objtrain(*args: object, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        objtrain_cmd(*args), cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )
