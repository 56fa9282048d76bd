"""Statistics of returns over seeds, from scipy: intervals that the reports and tables of
every run kind share."""

from __future__ import annotations

import numpy as np


def bootstrap_ci(values: np.ndarray, confidence: float = 0.95, seed: int = 0
                 ) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values [S]`` (scipy's bootstrap,
    5000 resamples); a single value, or equal values, give a zero-width interval."""
    from scipy import stats

    values = np.asarray(values, np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    if values.size == 1 or np.all(values == values[0]):
        return float(values[0]), float(values[0])
    result = stats.bootstrap(
        (values,), np.mean, confidence_level=confidence, n_resamples=5000,
        method="percentile", random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)

