"""This repository's published findings (docs/findings): the experiments, their commands and the index page.

Not part of the installed package: run from the repository's root as `python -m scripts.findings ...`.
"""
