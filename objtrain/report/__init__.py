"""How a comparison and a sweep read: report.md, the terminal tables and the PNG plots, from the results
`objtrain.compare` builds (`results.build_results`, `sweep_results.build_sweep_results`).

write_report(c)          # a comparison: results.json, report.md, val_loss_*.png and metrics.png
write_sweep_report(s)    # a sweep: results.json, report.md and curves.png
print_tables(results, console)

The parts both share (the claims table, markdown and terminal tables, the report's head, plot scaffolding)
are `tables` and `plots`; `comparison` and `sweep` are each report's own sections.
"""

from objtrain.report.comparison import print_tables, write_report
from objtrain.report.sweep import write_sweep_report

__all__ = ["print_tables", "write_report", "write_sweep_report"]
