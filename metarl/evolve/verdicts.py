"""Verdicts from what an evaluation's plan trained: the record's results, statistics,
tuning, across and suite sections (:func:`verdicts`), the comparisons they hold
(:func:`judge`, :func:`environment_statistics`) and their plain-text tables
(:func:`format_table`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from metarl.evolve import tuning
from metarl.evolve.judging import TUNED, comparison_pairs, held_out_scores, text_table
from metarl.evolve.plan import (
    ACROSS,
    HELD_OUT,
    TUNED_HELD_OUT,
    UNTRAINED_ROW,
    EvaluationPlan,
    Training,
)
from metarl.evolve.suite_verdicts import suite_section
from metarl.stats import (
    AGGREGATES,
    CONFIDENCE,
    RESAMPLES,
    SEED,
    aggregates,
    probability_of_improvement,
    verdict,
)

__all__ = ["APART_MARK", "SEEN_MARK", "SEEN_NOTE", "environment_statistics", "format_table",
           "held_out_seeds_line", "judge", "settled_apart", "verdicts"]

APART_MARK = " †"  # after a tuned verdict whose two rows settled where the other never tuned
SEEN_MARK = " *"  # after a verdict judged on held-out seeds an earlier evaluation used
SEEN_NOTE = ("judged on seen seeds: earlier evaluations already used these held-out seeds, "
             "so this verdict is no fresh test")


def verdicts(plan: EvaluationPlan, trained: Mapping[Training, Any]) -> dict[str, Any]:
    """The sections of an evaluation record that ``plan``'s trainings (``trained``, from
    :func:`metarl.evolve.plan.train_plan`) make, in the record's order: ``tuning`` (a tuned
    plan), ``across`` (a plan across a knob), ``results`` (every held-out row, task by
    task, then every tuned row), ``statistics`` (:func:`environment_statistics`) and
    ``suite`` (a suite's plan: :func:`metarl.evolve.suite_verdicts.suite_section`)."""
    tuned = [trained[t] for t in plan.of_kind(TUNED_HELD_OUT)]
    rows = [trained[t] for t in plan.of_kind(HELD_OUT)] + [row for _, row in tuned]
    results = [row.__dict__ for row in rows]
    statistics = environment_statistics(results)
    records: dict[str, dict[str, Any]] = {}
    for training, (record, _) in zip(plan.of_kind(TUNED_HELD_OUT), tuned, strict=True):
        records.setdefault(training.task, {})[training.name] = record
    settings = plan.tuning
    sections = {}
    if settings is not None:
        sections["tuning"] = {"seeds": settings.seeds, "tune_seed": settings.seed,
                              "tune_by": settings.by, "rounds": settings.rounds,
                              "score": tuning.SCORES[settings.by],
                              "budget_rule": tuning.WIDENING_BUDGET_RULE,
                              "environments": records}
    if plan.axis is not None:
        sections["across"] = _across_section(plan, trained)
    sections |= {"results": results, "statistics": statistics}
    if plan.suite is not None:
        untrained = {t.task: trained[t].__dict__ for t in plan.of_kind(UNTRAINED_ROW)}
        trained_envs = {inner.env_id for inner in plan.config.inner}
        trained_on = [task for task, inner in plan.tasks.items()
                      if inner.env_id in trained_envs]
        sections["suite"] = suite_section(plan.suite, results, untrained, trained_on,
                                          statistics,
                                          None if settings is None else records)
    return sections


def _across_section(plan: EvaluationPlan, trained: Mapping[Training, Any]) -> dict[str, Any]:
    """The ``across`` section: the knob, its values and per task every objective's points
    (the evolved objective's first)."""
    environments: dict[str, dict[str, Any]] = {}
    for training in plan.of_kind(ACROSS):
        environments.setdefault(training.task, {})[training.name] = trained[training]
    return {"knob": plan.axis.name, "values": list(plan.axis.values), "seeds": plan.seeds,
            "eval_seed": plan.eval_seed, "metric": plan.config.fitness.metric,
            "environments": environments}


def judge(evolved: str, baseline: str, evolved_scores, baseline_scores, paired: bool,
          resamples: int = RESAMPLES) -> dict[str, Any]:
    """The comparison of ``evolved_scores [S]`` with ``baseline_scores [S']`` (paired:
    trained on the same seeds, ``S == S'``): P(improvement) of ``evolved`` over
    ``baseline`` with its 95% interval and :func:`metarl.stats.verdict`, as saved in an
    evaluation record."""
    estimate = probability_of_improvement(evolved_scores, baseline_scores, paired=paired,
                                          resamples=resamples)
    return {"evolved": evolved, "baseline": baseline,
            "probability_of_improvement": estimate.value, "low": estimate.low,
            "high": estimate.high, "paired": paired,
            "verdict": verdict(estimate.low, estimate.high)}


def environment_statistics(results: Sequence[Mapping[str, Any]], resamples: int = RESAMPLES
                           ) -> dict[str, Any]:
    """The statistics of an evaluation's ``results`` (saved
    :class:`~metarl.evolve.rows.ObjectiveResult` dicts), per environment: each objective's
    IQM, median and mean with intervals (``objectives``) and the comparisons of
    :func:`~metarl.evolve.judging.comparison_pairs` (``comparisons``, each from
    :func:`judge`), every interval from ``resamples`` bootstrap resamples. The objectives
    of one evaluation train on the same held-out keys, so a comparison is paired wherever
    both have as many seeds."""
    environments = {}
    for env_id in dict.fromkeys(r["env_id"] for r in results):
        scores = {r["objective"]: held_out_scores(r) for r in results if r["env_id"] == env_id}
        environments[env_id] = {
            "objectives": {name: {metric: estimate.to_dict() for metric, estimate
                                  in aggregates(values, resamples=resamples).items()}
                           for name, values in scores.items()},
            "comparisons": [judge(evolved, baseline, scores[evolved], scores[baseline],
                                  paired=scores[evolved].size == scores[baseline].size,
                                  resamples=resamples)
                            for evolved, baseline in comparison_pairs(list(scores))],
        }
    return {"confidence": CONFIDENCE, "resamples": resamples, "seed": SEED,
            "environments": environments}


def _scored_range(record: Mapping[str, Any], knob: str) -> tuple[float, float] | None:
    values = [s["setting"][knob] for s in record.get("settings") or ()
              if knob in (s.get("setting") or {})]
    return (min(values), max(values)) if values else None


def settled_apart(report: Mapping[str, Any]) -> dict[tuple[str, str, str], list[dict]]:
    """Tuned comparisons whose two rows settled where the other never tuned, keyed by
    (environment, evolved row, baseline row): per shared knob, each side's choice and the
    range of values the other side scored. Widening follows a choice at an edge only, so a
    row whose best first-grid point is inside its grid never tries a far region another
    row's widening reached; the verdict then measures how far each row's tuning went
    (judge again with ``--tune-grid`` spanning both). Computed from the record's ``tuning``
    section, so records saved before this check are read alike."""
    environments = (report.get("tuning") or {}).get("environments") or {}
    statistics = (report.get("statistics") or {}).get("environments") or {}
    found: dict[tuple[str, str, str], list[dict]] = {}
    for env_id, records in environments.items():
        for c in statistics.get(env_id, {}).get("comparisons", []):
            rows = (c["evolved"], c["baseline"])
            if not all(row.endswith(TUNED) for row in rows):
                continue
            names = [row.removesuffix(TUNED) for row in rows]
            evolved, baseline = (records.get(name) or {} for name in names)
            knobs = (evolved.get("chosen") or {}).keys() & (baseline.get("chosen") or {}).keys()
            for knob in sorted(knobs):
                spans = [_scored_range(evolved, knob), _scored_range(baseline, knob)]
                chosen = [evolved["chosen"][knob], baseline["chosen"][knob]]
                if None in spans:
                    continue
                outside = [not (low * (1 - 1e-6) <= value <= high * (1 + 1e-6))
                           for value, (low, high) in zip(chosen, reversed(spans), strict=True)]
                if any(outside):
                    found.setdefault((env_id, c["evolved"], c["baseline"]), []).append(
                        {"knob": knob, "chosen": dict(zip(names, chosen, strict=True)),
                         "scored": {name: list(span)
                                    for name, span in zip(names, spans, strict=True)}})
    return found


def _apart_lines(apart: Mapping[tuple[str, str, str], list[dict]]) -> list[str]:
    lines = []
    for (env_id, _, _), knobs in apart.items():
        for entry in knobs:
            (first, a), (second, b) = entry["chosen"].items()
            spans = "; ".join(f"{name} scored {low:.3g} to {high:.3g}"
                              for name, (low, high) in entry["scored"].items())
            lines.append(f"{APART_MARK.strip()} {env_id}: {first} and {second} settled where "
                         f"the other never tuned: {entry['knob']} {a:.3g} against {b:.3g} "
                         f"({spans}); judge again with one grid spanning both "
                         f"(--tune-grid {entry['knob']}=...)")
    return lines


def format_table(report: dict[str, Any]) -> str:
    """Plain-text tables of an evaluation: per environment and objective the IQM, median and
    mean of the held-out scores with 95% intervals; then each comparison of the evolved
    objective with a baseline, its P(improvement), interval and verdict. A record saved
    without ``statistics`` (an older version's) gets them computed from its returns. The
    run's held-out tasks (``held_out_tasks``) are marked "(held out)"."""
    statistics = report.get("statistics") or environment_statistics(report["results"])
    held_out = set(report.get("held_out_tasks") or ())

    def task(label: str) -> str:
        return f"{label} (held out)" if label in held_out else label

    environments = statistics["environments"]
    metric = report.get("metric", "score")
    rows = [("environment", "objective", f"{metric} IQM", "95% CI", "median", "95% CI",
             "mean", "95% CI", "invalid")]
    for r in report["results"]:
        estimates = environments.get(r["env_id"], {}).get("objectives", {}).get(
            r["objective"], {})
        cells = []
        for name in AGGREGATES:
            e = estimates.get(name, {"value": np.nan, "low": np.nan, "high": np.nan})
            cells += [f"{e['value']:.2f}", f"[{e['low']:.2f}, {e['high']:.2f}]"]
        rows.append((task(r["env_id"]), r["objective"], *cells, str(r.get("invalid", 0))))
    blocks = [held_out_seeds_line(report) + "\n" + text_table(rows)]
    found = [(env_id, c) for env_id, data in environments.items()
             for c in data.get("comparisons", [])]
    if found:
        seen = SEEN_MARK if report.get("eval_seed_reused") else ""
        apart = settled_apart(report)
        rows = [("environment", "objective", "vs baseline", "P(improvement)", "95% CI",
                 "paired", "verdict")]
        rows += [(task(env_id), c["evolved"], c["baseline"],
                  f"{c['probability_of_improvement']:.2f}",
                  f"[{c['low']:.2f}, {c['high']:.2f}]", "yes" if c["paired"] else "no",
                  c["verdict"] + seen
                  + (APART_MARK if (env_id, c["evolved"], c["baseline"]) in apart else ""))
                 for env_id, c in found]
        notes = ["verdict: better / worse when the 95% interval of P(improvement) lies wholly "
                 "above / below 0.5, else no difference found", *_apart_lines(apart)]
        if seen:
            earlier = ", ".join(str(i) for i in report.get("eval_seed_earlier_records") or [])
            notes.append(f"{SEEN_MARK.strip()} {SEEN_NOTE} (evaluations {earlier or '?'} "
                         f"of this run used root {report.get('eval_seed')})")
        blocks.append(text_table(rows) + "\n" + "\n".join(notes))
    return "\n\n".join(blocks)


def held_out_seeds_line(report: Mapping[str, Any]) -> str:
    """How many held-out seeds an evaluation record used and their root, as a table's
    first line."""
    spec = report.get("spec") if isinstance(report.get("spec"), Mapping) else {}
    seeds = report.get("seeds", spec.get("seeds"))
    if seeds is None:  # an old record: as many as its rows have
        seeds = max((len(r.get("returns") or []) for r in report.get("results") or []),
                    default=0)
    root = report.get("eval_seed", spec.get("eval_seed"))
    return (f"held-out seeds: {seeds} per objective and task, keys split from root "
            f"{root if root is not None else 'unrecorded'}")
