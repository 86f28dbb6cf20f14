"""The repository's own maintenance scripts (not installed with the package)."""
