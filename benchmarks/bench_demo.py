"""`make demo` timed, command by command, as a new user runs it (output piped, so no progress bars).

The targets: about 5 minutes on an idle 2-core machine, well under 15 beside other work, progress at least
every minute or so while piped, and an ending that shows the toolkit's point: the comparison's tables and
verdict, then one sentence saying what the comparison found ("In short: ..."). The commands come from
`make -n demo` (so this measures the Makefile as shipped), each run from the repository root into a
scratch DEMO_DIR, with the machine's load average before and after: on a shared machine the total is
only comparable with a run at the same load.

    .venv/bin/python benchmarks/bench_demo.py                # the whole demo, ~5 minutes idle
    .venv/bin/python benchmarks/bench_demo.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def demo_commands(demo_dir: Path) -> list[str]:
    """The shell commands `make demo` runs (the install step is already done)."""
    out = subprocess.run(
        ["make", "-s", "-n", "demo", f"DEMO_DIR={demo_dir}"], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    # make -n prints continued lines with their backslashes: join them back into one command
    text = out.stdout.replace("\\\n", " ")
    return [line for line in text.splitlines() if "objtrain" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    results: dict[str, Any] = {"load_before": os.getloadavg()[0], "commands": []}
    print(f"load average {results['load_before']:.2f} on {os.cpu_count()} cores at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_demo-") as tmp:
        demo_dir = Path(tmp) / "demo"
        commands = demo_commands(demo_dir)
        total0 = time.perf_counter()
        longest_silence = 0.0
        last_out = ""
        for cmd in commands:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                ["bash", "-c", cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            lines, last_line = [], time.perf_counter()
            for line in proc.stdout:
                now = time.perf_counter()
                longest_silence = max(longest_silence, now - last_line)
                last_line = now
                lines.append(line)
            proc.wait()
            seconds = time.perf_counter() - t0
            name = " ".join(shlex.split(cmd)[:2]).replace(str(ROOT / ".venv/bin/"), "")
            print(f"{seconds:7.1f}s  rc {proc.returncode}  {cmd[:110]}", flush=True)
            results["commands"].append({"command": cmd, "seconds": seconds, "rc": proc.returncode})
            last_out = "".join(lines)
            if proc.returncode:
                print(last_out[-3000:])
                raise SystemExit(f"{name} failed")
            if " compare " in cmd:
                results["compare_tail"] = last_out[-2500:]
        total = time.perf_counter() - total0
    ending = re.sub(r"\x1b\[[0-9;]*m", "", last_out).rstrip()
    results.update(
        total_seconds=total,
        load_after=os.getloadavg()[0],
        longest_silence_seconds=longest_silence,
        last_output=ending,
        ends_on_finding=ending.splitlines()[-1].startswith("In short:") if ending else False,
        ends_on_verdict="verdict" in results.get("compare_tail", ""),
    )
    print(f"\ncompare's ending:\n{results.get('compare_tail', '')}")
    print(
        f"make demo: {total:.0f} s ({total / 60:.1f} min), load average {results['load_before']:.1f} -> "
        f"{results['load_after']:.1f}; longest silence {longest_silence:.0f} s; compare ends on its verdict: "
        f"{results['ends_on_verdict']}; the demo ends on one sentence of what it found: "
        f"{results['ends_on_finding']}"
    )
    print(
        f"targets: <= ~300 s idle / < 900 s busy -> {'met' if total < 900 else 'NOT met'} at this load "
        f"(idle target judged only at load < 1)"
    )
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
