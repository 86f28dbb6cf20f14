"""Model tests share `model_helpers` (hand-built batches, naive attention); make it importable."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
