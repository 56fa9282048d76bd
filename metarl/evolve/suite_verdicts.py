"""Cross-environment verdicts: one objective judged on every environment of a suite.

``metarl evaluate RUN --suite NAME`` trains the evolved objective and its baselines on every
environment of the suite (:mod:`metarl.suites`) on the same held-out seeds, as a plain
evaluation does on one environment, and adds a ``suite`` section to the record:

- **one row per environment**: each side's IQM with its interval, P(improvement) with its
  interval, the verdict of :func:`metarl.stats.verdict`, and the knobs tuning chose at an
  edge of their grid;
- **one pooled row per comparison**, over the suite's environments the run never trained on
  (all of them when it trained on every one): the IQM over environment x seed of returns
  *normalised per environment* between the untrained policy (0) and the baseline of the
  comparison as evaluated on the held-out seeds, tuned with ``--tune`` (1), with a
  stratified bootstrap interval (:func:`metarl.stats.aggregate`); and P(improvement)
  pooled over the environments (:func:`metarl.stats.stratified_probability_of_improvement`).

Why these two ends: the untrained policy (PPO's initial policy, trained at learning rate 0,
near-uniform over actions) is the random policy of the environment scored by the run's own
fitness metric on the same seeds, so 0 means "learned nothing"; the baseline is what the
objective must beat, so 1 means "as good as the baseline" and the scale does not depend on
an environment's units. An environment where the baseline is no better than the untrained
policy cannot be normalised and is left out of the pooled IQM (it stays in the pooled
P(improvement), which needs no scale); a diverged run scores as the untrained policy.

The pooled verdict is "transfers" only where the pooled interval of P(improvement) lies
wholly above 0.5, "worse" where it lies wholly below, else "no difference found".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metarl.evolve.judging import (
    TUNED,
    comparison_pairs,
    evaluation_figure_path,
    held_out_scores,
    save_evaluation_figure,
    text_table,
)
from metarl.evolve.tuning import grid_edges
from metarl.stats import (
    BETTER,
    aggregate,
    stratified_probability_of_improvement,
    verdict,
)

__all__ = ["NORMALISATION", "TRANSFERS", "UNTRAINED", "format_suite", "pooled_row",
           "save_suite_figure", "suite_figure_path", "suite_section", "untrained_hypers"]

UNTRAINED = "untrained policy"
TRANSFERS = "transfers"
NORMALISATION = ("per environment, (score - untrained) / (baseline - untrained): 0 is the "
                 "untrained policy (learning rate 0, the random policy of the environment), "
                 "1 the baseline of the comparison on the same held-out seeds")


def untrained_hypers(learner):
    """``learner``'s default hyperparameters with a learning rate of 0: its initial policy,
    never updated."""
    return learner.default_hypers._replace(
        learning_rate=learner.default_hypers.learning_rate * 0)


def _pairs(objectives: Sequence[str]) -> list[tuple[str, str]]:
    pairs = comparison_pairs(objectives)
    tuned = [pair for pair in pairs if pair[0].endswith(TUNED)]
    return tuned or pairs  # with --tune, the verdicts that count are the tuned ones


def suite_section(suite: Mapping[str, Any], results: Sequence[Mapping[str, Any]],
                  untrained: Mapping[str, Mapping[str, Any]], trained_on: Sequence[str],
                  statistics: Mapping[str, Any], tuning: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The ``suite`` section of an evaluation record (module docstring).

    Args:
        suite: :meth:`metarl.suites.Suite.to_dict`.
        results: the record's ``results`` (saved ``ObjectiveResult`` dicts, keyed by
            ``env_id``: the suite's task labels).
        untrained: task label -> the untrained policy's result on the held-out seeds.
        trained_on: the run's training tasks (left out of the pooled rows).
        statistics: the record's ``statistics`` (per environment comparisons).
        tuning: the record's ``tuning.environments`` (label -> objective -> record), if
            tuned.
    """
    labels = [label for label in (*suite["train"], *suite["test"])
              if any(r["env_id"] == label for r in results)]
    pooled_over = [label for label in labels if label not in trained_on] or labels
    by_env = {label: {r["objective"]: r for r in results if r["env_id"] == label}
              for label in labels}
    pairs = _pairs(list(by_env[labels[0]])) if labels else []
    rows = []
    for label in labels:
        comparisons = {(c["evolved"], c["baseline"]): c
                       for c in statistics["environments"][label]["comparisons"]}
        for evolved, baseline in pairs:
            comparison = comparisons[(evolved, baseline)]
            rows.append({
                "environment": label, "side": "train" if label in suite["train"] else "test",
                "trained_on": label in trained_on, "evolved": evolved, "baseline": baseline,
                "evolved_iqm": aggregate(held_out_scores(by_env[label][evolved])).to_dict(),
                "baseline_iqm": aggregate(held_out_scores(by_env[label][baseline])).to_dict(),
                "untrained_iqm": aggregate(held_out_scores(untrained[label])).value,
                "probability_of_improvement": {
                    key: comparison[key] for key in ("probability_of_improvement", "low",
                                                     "high")},
                "verdict": comparison["verdict"],
                "at_edge": _edges(tuning, label, evolved, baseline),
            })
    pooled = [pooled_row(evolved, baseline, pooled_over, by_env, untrained)
              for evolved, baseline in pairs]
    return {**suite, "normalisation": NORMALISATION, "pooled_over": pooled_over,
            "trained_on": [label for label in labels if label in trained_on],
            "environments": rows, "pooled": pooled}


def _edges(tuning, label, evolved, baseline) -> dict[str, dict[str, str]]:
    if not tuning or label not in tuning:
        return {}
    found = {}
    for name in (evolved, baseline):
        record = tuning[label].get(name.removesuffix(TUNED))
        if record and record.get("settings"):
            edges = grid_edges(record)
            if edges:
                found[name] = edges
    return found


def pooled_row(evolved: str, baseline: str, labels: Sequence[str],
               by_env: Mapping[str, Mapping[str, Mapping[str, Any]]],
               untrained: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One pooled comparison over the strata ``labels`` (module docstring): ``by_env``
    label -> objective -> saved result, ``untrained`` label -> the untrained policy's saved
    result (the floor of that label's normalisation)."""
    raw = {name: np.stack([held_out_scores(by_env[label][name]) for label in labels], axis=1)
           for name in (evolved, baseline)}  # [S, T]
    normalisable, left_out = [], []
    for index, label in enumerate(labels):
        floor = aggregate(held_out_scores(untrained[label])).value
        reference = aggregate(raw[baseline][:, index]).value
        (normalisable if np.isfinite(reference - floor) and reference - floor > 1e-8
         * max(1.0, abs(reference)) else left_out).append((index, label, floor, reference))
    normalised = {}
    for name, scores in raw.items():
        columns = [(scores[:, index] - floor) / (reference - floor)
                   for index, _, floor, reference in normalisable]
        values = np.stack(columns, axis=1) if columns else np.empty((scores.shape[0], 0))
        normalised[name] = np.where(np.isfinite(values), values, 0.0)  # diverged: untrained
    improvement = stratified_probability_of_improvement(raw[evolved], raw[baseline])
    outcome = verdict(improvement.low, improvement.high)
    return {
        "evolved": evolved, "baseline": baseline, "environments": list(labels),
        "normalised_iqm": {name: (aggregate(values).to_dict() if values.size else None)
                           for name, values in normalised.items()},
        "not_normalised": [label for _, label, _, _ in left_out],
        "diverged": {name: int((~np.isfinite(scores)).sum()) for name, scores in raw.items()},
        "probability_of_improvement": improvement.to_dict(),
        "verdict": TRANSFERS if outcome == BETTER else outcome,
    }


def _interval(estimate: Mapping[str, float] | None, digits: int = 3) -> str:
    if not estimate:
        return "-"
    return (f"{estimate['value']:.{digits}g} [{estimate['low']:.{digits}g}, "
            f"{estimate['high']:.{digits}g}]")


def format_suite(report: Mapping[str, Any]) -> str:
    """The record's ``suite`` section as text: one row per environment and comparison,
    then the pooled rows."""
    section = report["suite"]
    rows = [("environment", "side", "objective", "IQM", "baseline", "baseline IQM",
             "P(improvement)", "verdict", "at a grid edge")]
    for row in section["environments"]:
        probability = row["probability_of_improvement"]
        edges = "; ".join(f"{name}: {', '.join(f'{k} {v}' for k, v in knobs.items())}"
                          for name, knobs in row["at_edge"].items()) or "-"
        rows.append((row["environment"] + (" (trained on)" if row["trained_on"] else ""),
                     row["side"], row["evolved"], _interval(row["evolved_iqm"]),
                     row["baseline"], _interval(row["baseline_iqm"]),
                     _interval({"value": probability["probability_of_improvement"],
                                "low": probability["low"], "high": probability["high"]}, 2),
                     row["verdict"], edges))
    for pooled in section["pooled"]:
        probability = pooled["probability_of_improvement"]
        rows.append((f"pooled ({len(pooled['environments'])} environments)", "",
                     pooled["evolved"], _interval(pooled["normalised_iqm"][pooled["evolved"]]),
                     pooled["baseline"],
                     _interval(pooled["normalised_iqm"][pooled["baseline"]]),
                     _interval(probability, 2), pooled["verdict"], ""))
    notes = [f"suite {section['name']} v{section['version']}: pooled over "
             f"{', '.join(section['pooled_over'])}; pooled IQMs are normalised "
             f"{section['normalisation']}"]
    for pooled in section["pooled"]:
        if pooled["not_normalised"]:
            notes.append(f"{pooled['evolved']} vs {pooled['baseline']}: "
                         f"{', '.join(pooled['not_normalised'])} left out of the pooled IQM "
                         "(the baseline is no better than the untrained policy there)")
    return text_table(rows) + "\n" + "\n".join(notes)


def suite_figure_path(run_dir: str | Path, record_id: Any) -> Path:
    """Where the figure of evaluation ``record_id``'s ``suite`` section is saved."""
    return evaluation_figure_path(run_dir, "suite", record_id)


def save_suite_figure(run_dir: str | Path, report: Mapping[str, Any], run_name: str) -> Path:
    """Draw ``report``'s ``suite`` section (:func:`metarl.figures.suites.plot_suite`) into
    :func:`suite_figure_path` and return the path."""
    from metarl.figures.suites import plot_suite

    section = report["suite"]
    fig = plot_suite(section, title=f"{run_name} on suite {section['name']} "
                                    f"v{section['version']} (evaluation {report['id']}, "
                                    f"{report['seeds']} seeds per environment)")
    return save_evaluation_figure(fig, run_dir, "suite", report["id"])
