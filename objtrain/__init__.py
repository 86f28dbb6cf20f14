"""objtrain: pre-train language models with every major objective, and compare them honestly."""

__version__ = "0.1.0"
IGNORE = -100  # label value for positions that carry no loss (cross_entropy's ignore_index)
