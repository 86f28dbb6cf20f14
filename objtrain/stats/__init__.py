"""The numbers a comparison and a sweep judge by, knowing nothing of runs, arms or reports.

`seeds`: an arm's metric over seeds (mean ± sample std, its 95% t interval), the paired difference of two
arms over their shared seeds, the evaluation's own standard error from per-unit scores, and the ranking of
arms on a metric. `fit`: the saturating power law E + A·C^(-α) of a metric over training compute, its
bootstrap intervals, and where two arms' curves cross.
"""
