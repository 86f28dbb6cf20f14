def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    total = 0.0
    for value in values:
        total += value
    return total / len(values)
