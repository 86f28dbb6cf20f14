"""The `objtrain` executable (and `python -m objtrain`).

Only the standard library is imported here, so a Ctrl-C while torch and the commands are still loading
ends with one line and exit 130 like a Ctrl-C at any later moment, not a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping


def openmp_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """OpenMP threads that finish a parallel region early sleep instead of spinning, unless the user chose
    (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`). Spinning costs nothing on an idle machine, but beside other
    work a spinning thread burns the core its descheduled sibling (or another program) needs, and every
    region then waits for that sibling: a training run fell to a quarter of its idle speed beside one busy
    process per core, well under its fair half (benchmarks/bench_busy.py). libgomp reads these once, when
    torch loads it, so they are set here, before anything imports torch; child processes (torchrun ranks,
    loader workers) inherit them."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def main() -> None:
    openmp_defaults()
    try:
        from objtrain.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was written\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
