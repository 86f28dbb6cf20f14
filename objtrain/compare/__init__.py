"""`objtrain compare`: train several arms under one equal budget, evaluate them alike, judge the claims.

exp = load_experiment(Path("configs/experiments/objectives.yaml"))
c = plan_comparison(exp, Path("reports/objectives"), budget="tiny")   # every check, nothing written
run_comparison(c)                                                      # train + evaluate each arm
results = build_results(c)                                             # objtrain.compare.results
objtrain.report.write_report(c)                                        # report.md, results.json, PNGs
"""

from objtrain.compare.experiment import Experiment, load_experiment
from objtrain.compare.runner import Comparison, plan_comparison, run_comparison

__all__ = ["Comparison", "Experiment", "load_experiment", "plan_comparison", "run_comparison"]
