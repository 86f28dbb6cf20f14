"""`python -m scripts.findings run | publish | refit`, from the repository's root (see findings.py)."""

import sys

from .findings import main

raise SystemExit(main(sys.argv[1:]))
