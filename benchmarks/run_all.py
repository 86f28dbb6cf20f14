"""Run every `benchmarks/bench_*.py` in turn (`make bench`), each in its own process with its defaults.

A benchmark whose imports fail (a peer library missing, a module not built yet) is skipped with the
message; any other failure is reported and the run goes on. Exit status: 1 if any benchmark failed.

    .venv/bin/python benchmarks/run_all.py
    .venv/bin/python benchmarks/run_all.py objectives models     # only bench_objectives.py, bench_models.py
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def missing_imports(script: Path) -> list[str]:
    """Top-level modules the script imports that cannot be found (checked without running it)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:  # module level only: imports inside functions may be optional peers
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    missing = []
    if str(script.parent) not in sys.path:  # a script runs with its own folder first on sys.path
        sys.path.insert(0, str(script.parent))
    for name in sorted(names):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="run only these (bench_<name>.py)")
    args = parser.parse_args()
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in args.only]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        missing = missing_imports(script)
        if missing:
            print(f"skipped: cannot import {', '.join(missing)}", flush=True)
            continue
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script)], cwd=HERE.parent, check=False, stderr=subprocess.PIPE, text=True
        )
        took = time.perf_counter() - start
        lines = proc.stderr.strip().splitlines()
        if proc.returncode != 0 and lines and lines[-1].startswith(("ImportError", "ModuleNotFoundError")):
            print(f"skipped: {lines[-1]}", flush=True)
            continue
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            failed.append(script.name)
            print(f"{script.name} failed with exit code {proc.returncode} after {took:.0f} s", flush=True)
        else:
            print(f"({script.name}: {took:.0f} s)", flush=True)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    print(f"\nall {len(scripts)} benchmarks ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
