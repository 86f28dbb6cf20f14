"""The `objtrain` executable (and `python -m objtrain`).

Only the standard library is imported here, so a Ctrl-C while torch and the commands are still loading
ends with one line and exit 130 like a Ctrl-C at any later moment, not a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from objtrain.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was written\n")
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
