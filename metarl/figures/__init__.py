"""Pure drawing: every figure the toolkit makes, as functions over arrays and records.

Each ``plot_*`` function returns a :class:`matplotlib.figure.Figure` built without pyplot
(nothing is shown and no GUI backend is needed; save it with ``fig.savefig(path)``). This
package imports nothing of metarl beyond itself: reading a run's files, evaluating a learned
function on a grid and choosing reference curves are the callers' jobs (a run kind's report,
an objective's plot hook), which pass in what is to be drawn.

- :mod:`.records`: fitness per generation, learning curves of an evaluation, sweeps,
  several runs' evaluations and performance profiles;
- :mod:`.drift`: drift functions ``D(r, A)`` and their change over training;
- :mod:`.value_distance`: a learned value distance against L2;
- :mod:`.learned_optimizer`: a learned update rule against the gradient, next to Adam's;
- :mod:`.distill`: distilled formulas over the network they were fitted to;
- :mod:`.population`: PBT, CEM-RL and DvD runs;
- :mod:`.style`: colours, figure construction, mean-and-interval bands.
"""

from metarl.figures.drift import (
    plot_drift,
    plot_drift_comparison,
    plot_drift_slices,
    plot_temporal_drift,
)
from metarl.figures.learned_optimizer import plot_learned_update
from metarl.figures.population import plot_cem_rl, plot_dvd, plot_pbt
from metarl.figures.records import (
    plot_fitness,
    plot_learning_curves,
    plot_sweep_curves,
    plot_sweep_heatmap,
)
from metarl.figures.value_distance import plot_value_distance

__all__ = [
    "plot_cem_rl",
    "plot_drift",
    "plot_drift_comparison",
    "plot_drift_slices",
    "plot_dvd",
    "plot_fitness",
    "plot_learned_update",
    "plot_learning_curves",
    "plot_pbt",
    "plot_sweep_curves",
    "plot_sweep_heatmap",
    "plot_temporal_drift",
    "plot_value_distance",
]
