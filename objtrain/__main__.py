"""The `objtrain` executable (and `python -m objtrain`).

Only the standard library is imported here, so a Ctrl-C while torch and the commands are still loading
ends with one line and exit 130 like a Ctrl-C at any later moment, not a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

SPIN_COUNT = "20000"  # libgomp's default is 300000 (about 0.3 M iterations, then sleep)


def openmp_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """OpenMP threads that finish a parallel region early spin only briefly before they sleep, unless the
    user chose (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`). libgomp's long default spin costs nothing on an idle
    machine, but beside other work a spinning thread burns the core its descheduled sibling (or another
    program) needs, and every region then waits for that sibling: a run fell to 0.18-0.31 of its idle speed
    beside one busy process per core, under its fair half. Never spinning (`OMP_WAIT_POLICY=PASSIVE`) kept
    0.44-0.62 of it beside them but lost 12-15% alone; a spin of 20,000 iterations, in three runs on 2
    cores (benchmarks/bench_busy.py): alone 0.96-0.99 of libgomp's default, beside the hogs 0.47-0.50 of
    its own idle speed (1.6-2.5x libgomp's default there). libgomp reads these once, when
    torch loads it, so they are set here, before anything imports torch; child processes (torchrun ranks,
    loader workers) inherit them."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT


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
