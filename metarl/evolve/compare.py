"""Many runs side by side: a table of what each reached and which settings differ, overlaid
fitness curves, and the learned functions of every run in the same figure.

    metarl compare runs/vd-seed0 runs/vd-seed1 runs/vd-seed2
    metarl compare runs/lpo runs/ta_lpo --evaluation 3,2   # evaluations/3.json and 2.json

Each run's held-out scores come from its latest evaluation of each environment and
objective, or, with ``evaluation``, from one chosen record ``evaluations/<N>.json`` per run,
so that a comparison made after some evaluations can be made again after later ones.

From Python: :func:`compare_runs` (the table's data), :func:`verdicts` and
:func:`pooled_verdicts` (the evolved objective against each baseline, run by run and over all
runs, by the rule of :func:`metarl.stats.verdict`), :func:`between_runs` (the runs' evolved
objectives against each other: variants of one experiment, or a search against its own
starting point), :func:`format_comparison` and
:func:`plot_comparison` (drawn by :mod:`metarl.figures.records`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from metarl.evolve.config import config_from_dict
from metarl.evolve.evaluate import SEEN_MARK, SEEN_NOTE, held_out_scores, judge
from metarl.evolve.judging import EVOLVED, TUNED, comparison_pairs
from metarl.objectives import get_objective
from metarl.objectives.registry import RunFigureRequest
from metarl.runs.engine import read_config
from metarl.runs.evaluations import list_records
from metarl.runs.layout import RunError, read_metrics
from metarl.runs.meta_params import MEAN_FILE, read_meta_params
from metarl.runs.replicates import expand_replicates
from metarl.stats import (
    OUTCOMES,
    RESAMPLES,
    Estimate,
    aggregate,
    performance_profile,
    pooled_probability_of_improvement,
    probability_of_improvement,
    profile_thresholds,
    verdict,
)


@dataclass(frozen=True)
class HeldOut:
    """One objective's held-out scores on one environment, from a run's latest evaluation
    of that pair (or from the one record the comparison was pointed at).

    Attributes:
        scores: ``[S]`` score of each seed, NaN for a seed whose training diverged.
        record: the path of the evaluation record they come from.
        eval_seed: the seed of its held-out key stream, where the record says it.
        seen: the record says an earlier evaluation of the run had used that root
            (``eval_seed_reused``): its verdicts are marked as judged on seen seeds.
    """

    scores: tuple[float, ...]
    record: str
    eval_seed: int | None
    seen: bool = False

    def paired_with(self, other: HeldOut) -> bool:
        """Whether both were trained on the same keys: as many seeds, from the same
        record or from records with the same held-out key stream."""
        same_keys = self.record == other.record or (
            self.eval_seed is not None and self.eval_seed == other.eval_seed)
        return len(self.scores) == len(other.scores) and same_keys


@dataclass(frozen=True)
class RunSummary:
    """What one run reached.

    Attributes:
        run_dir: its directory.
        label: its name in tables and legends (the directory's name, made unique).
        objective: the registered objective it evolved.
        generations: generations finished.
        best_fitness: best candidate fitness seen.
        final_mean_fitness: mean fitness of the candidates of the last generation.
        evaluations: ``(environment, objective, mean, ci_low, ci_high)`` rows of its
            held-out evaluations, if any.
        settings: every config field as ``"section.field" -> value``.
        held_out: ``(environment, objective) ->`` the per-seed scores behind each row of
            ``evaluations``.
        evaluation: the number ``N`` of the one record ``evaluations/<N>.json`` they come
            from, or ``None`` when every record counts (the latest of each pair wins).
    """

    run_dir: Path
    label: str
    objective: str
    generations: int
    best_fitness: float
    final_mean_fitness: float
    evaluations: tuple[tuple[str, str, float, float, float], ...]
    settings: dict[str, Any]
    held_out: dict[tuple[str, str], HeldOut] = field(default_factory=dict)
    evaluation: int | None = None


@dataclass(frozen=True)
class Comparison:
    """Runs and the settings in which they differ (``"section.field" -> value per run``)."""

    runs: tuple[RunSummary, ...]
    differing: dict[str, list[Any]]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"es": {"sigma": 0.1}, "inner": [{...}]}`` -> ``{"es.sigma": 0.1, "inner.0...."}``."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list) and any(isinstance(v, dict | list) for v in data):
        items = ((str(i), v) for i, v in enumerate(data))
    else:
        return {prefix: data}
    flat = {}
    for key, value in items:
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _evaluations(records: Sequence[dict[str, Any]]
                 ) -> tuple[tuple[tuple[str, str, float, float, float], ...],
                            dict[tuple[str, str], HeldOut]]:
    """One ``(environment, objective, mean, ci_low, ci_high)`` row per environment and
    objective of the evaluation ``records`` (oldest first), and the scores behind it; the
    latest evaluation wins where several evaluated the same pair. A result saved without
    its mean or interval (an older version's) gets them from its returns."""
    rows, held_out = {}, {}
    for report in records:
        spec = report.get("spec") if isinstance(report.get("spec"), dict) else {}
        eval_seed = report.get("eval_seed", spec.get("eval_seed"))
        for r in report.get("results") or []:
            if not isinstance(r, dict) or "env_id" not in r or "objective" not in r:
                continue
            scores = held_out_scores(r)
            if all(r.get(key) is not None for key in ("mean", "ci_low", "ci_high")):
                mean = Estimate(r["mean"], r["ci_low"], r["ci_high"])
            else:
                mean = aggregate(scores, "mean")
            key = (r["env_id"], r["objective"])
            rows[key] = (*key, mean.value, mean.low, mean.high)
            held_out[key] = HeldOut(tuple(float(v) for v in scores), str(report.get("path")),
                                    eval_seed, bool(report.get("eval_seed_reused")))
    return tuple(rows.values()), held_out


@dataclass(frozen=True)
class Verdict:
    """A run's evolved objective against one baseline on one environment, judged from the
    per-seed scores of its latest evaluation of both (or of the one record chosen).

    ``probability`` is P(improvement) of ``evolved`` over ``baseline`` (paired where both
    were trained on the same keys), ``low`` and ``high`` its 95% interval, and ``outcome``
    :func:`metarl.stats.verdict` of it: ``"better"`` when the interval lies wholly above
    0.5, ``"worse"`` when wholly below, else ``"no difference found"``.
    """

    run: str
    env_id: str
    evolved: str
    baseline: str
    probability: float
    low: float
    high: float
    paired: bool
    outcome: str


def verdicts(comparison: Comparison) -> list[Verdict]:
    """The evolved objective of every evaluated run against each of its baselines (the
    pairs of :func:`metarl.evolve.evaluate.comparison_pairs`); a pair whose record saved no
    per-seed returns is left out."""
    found = []
    for run in comparison.runs:
        for env in dict.fromkeys(env for env, _ in run.held_out):
            names = [objective for e, objective in run.held_out if e == env]
            for evolved, baseline in comparison_pairs(names):
                x, y = run.held_out[(env, evolved)], run.held_out[(env, baseline)]
                if not x.scores or not y.scores:
                    continue
                paired = x.paired_with(y)
                judged = judge(evolved, baseline, x.scores, y.scores, paired)
                found.append(Verdict(run.label, env, evolved, baseline,
                                     judged["probability_of_improvement"], judged["low"],
                                     judged["high"], paired, judged["verdict"]))
    return found


@dataclass(frozen=True)
class RunVerdict:
    """One run's evolved objective against another run's on one environment: P(improvement)
    of ``first`` over ``second`` (``probability``, with its 95% interval ``low``, ``high``;
    paired where both were trained on the same keys) and ``outcome``
    (:func:`metarl.stats.verdict`). ``objective`` is the row compared, ``"evolved"`` or
    ``"evolved (tuned)"`` (each run at its own tuned setting)."""

    first: str
    second: str
    env_id: str
    objective: str
    probability: float
    low: float
    high: float
    paired: bool
    outcome: str


def between_runs(comparison: Comparison) -> list[RunVerdict]:
    """Every run's evolved objective against each later run's, on each environment where
    both evaluated it, at the default setting and, where both were tuned, tuned. Runs
    evaluated with the same ``--seeds`` and ``--eval-seed`` trained on the same keys and are
    compared seed by seed. Comparing a search with a run of its starting point (the same
    experiment stopped after one generation) says whether the search moved anything."""
    found = []
    for index, first in enumerate(comparison.runs):
        for second in comparison.runs[index + 1:]:
            for env, objective in first.held_out:
                if objective not in (EVOLVED, EVOLVED + TUNED) or (
                        (env, objective) not in second.held_out):
                    continue
                x, y = first.held_out[(env, objective)], second.held_out[(env, objective)]
                if not x.scores or not y.scores:
                    continue
                paired = x.paired_with(y)
                judged = judge(first.label, second.label, x.scores, y.scores, paired)
                found.append(RunVerdict(first.label, second.label, env, objective,
                                        judged["probability_of_improvement"], judged["low"],
                                        judged["high"], paired, judged["verdict"]))
    return found


@dataclass(frozen=True)
class PooledVerdict:
    """The evolved objective against one baseline on one environment over all compared runs
    that evaluated both: how many runs were judged better / no difference found / worse,
    and the runs' held-out seeds pooled.

    Attributes:
        env_id, evolved, baseline: what is compared.
        counts: ``{outcome: runs}`` over :data:`metarl.stats.OUTCOMES`.
        evolved_iqm, baseline_iqm: interquartile mean over runs x held-out seeds (the
            baseline over its distinct evaluations: one read by every run counts once).
        probability: P(improvement) over all runs x seeds with its 95% interval: where every
            run was scored on the same held-out keys, paired seed by seed with the seed as
            the resampling unit (:func:`metarl.stats.pooled_probability_of_improvement`);
            otherwise over all pairs of the runs' scores and the baseline's distinct ones.
        paired: whether it is paired.
        outcome: :func:`metarl.stats.verdict` of ``probability``.
        evolved_scores, baseline_scores: ``[R*S]`` the pooled scores (the baseline's
            distinct evaluations only: ``[S]`` when every run read the same one).
    """

    env_id: str
    evolved: str
    baseline: str
    counts: dict[str, int]
    evolved_iqm: Estimate
    baseline_iqm: Estimate
    probability: Estimate
    paired: bool
    outcome: str
    evolved_scores: np.ndarray
    baseline_scores: np.ndarray

    @property
    def runs(self) -> int:
        return sum(self.counts.values())


def pooled_verdicts(comparison: Comparison, found: list[Verdict] | None = None,
                    resamples: int = RESAMPLES) -> list[PooledVerdict]:
    """Per (environment, evolved, baseline) of :func:`verdicts` (``found``, computed when
    not given): the counts of runs per outcome and the verdict over all runs together (its
    intervals from ``resamples`` bootstrap resamples)."""
    found = verdicts(comparison) if found is None else found
    by_label = {run.label: run for run in comparison.runs}
    pooled = []
    for env, evolved, baseline in dict.fromkeys((v.env_id, v.evolved, v.baseline)
                                                for v in found):
        judged = [v for v in found if (v.env_id, v.evolved, v.baseline) == (env, evolved,
                                                                           baseline)]
        xs = [by_label[v.run].held_out[(env, evolved)] for v in judged]
        ys = [by_label[v.run].held_out[(env, baseline)] for v in judged]
        x = np.concatenate([held.scores for held in xs])
        # The baseline trained on the same keys for every run (one evaluation read by all,
        # or the same one repeated in each run's record) is one sample of its seeds, not R.
        distinct_y = np.concatenate(list({
            (held.record if held.eval_seed is None else held.eval_seed, held.scores):
            held.scores for held in ys}.values()))
        # Paired over all runs when every run was scored on the same held-out keys: then
        # the seed is the unit the interval resamples (stats.pooled_probability_of_...).
        paired = (all(v.paired for v in judged)
                  and all(held.paired_with(xs[0]) for held in xs))
        if paired:
            probability = pooled_probability_of_improvement(
                np.stack([held.scores for held in xs]), np.stack([held.scores for held in ys]),
                resamples=resamples)
        else:
            probability = probability_of_improvement(x, distinct_y, paired=False,
                                                     resamples=resamples)
        pooled.append(PooledVerdict(
            env, evolved, baseline, {o: sum(v.outcome == o for v in judged) for o in OUTCOMES},
            aggregate(x, "iqm", resamples=resamples),
            aggregate(distinct_y, "iqm", resamples=resamples),
            probability, paired,
            verdict(probability.low, probability.high), x, distinct_y))
    return pooled


def chosen_records(run_dir: str | Path, evaluation: int | None) -> list[dict[str, Any]]:
    """The evaluation records of ``run_dir`` a comparison reads: all of them, oldest first
    (``evaluation=None``), or the one saved as ``evaluations/<evaluation>.json``, with a
    :class:`RunError` naming the run and the records it has when there is no such one."""
    records = list_records(run_dir)
    if evaluation is None:
        return records
    chosen = [record for record in records if record["id"] == evaluation]
    if not chosen:
        numbers = [str(record["id"]) for record in records if isinstance(record["id"], int)]
        held = f"its records: {', '.join(numbers)}" if numbers else "it has none"
        raise RunError(f"{run_dir} has no evaluations/{evaluation}.json ({held})")
    return chosen


def summarise_run(run_dir: str | Path, label: str | None = None,
                  records: Sequence[dict[str, Any]] | None = None,
                  evaluation: int | None = None) -> RunSummary:
    """Read one run directory (:class:`RunError` naming what is missing); its held-out
    scores come from ``records`` (evaluation reports of it) when given, else from the
    record ``evaluations/<evaluation>.json`` when ``evaluation`` is given, else from every
    evaluation saved in it (:func:`chosen_records`)."""
    run_dir = Path(run_dir)
    config = read_config(run_dir, config_from_dict)
    history = read_metrics(run_dir)
    if not history:
        raise RunError(f"{run_dir} has no finished generation yet (metrics.jsonl is empty)")
    last = history[-1]
    evaluations, held_out = _evaluations(chosen_records(run_dir, evaluation) if records is None
                                         else records)
    return RunSummary(
        run_dir=run_dir,
        label=label or run_dir.name,
        objective=config.objective.name,
        generations=int(last["generation"]),
        best_fitness=float(last.get("best_fitness_so_far", np.nan)),
        final_mean_fitness=float(last.get("mean_fitness", np.nan)),
        evaluations=evaluations,
        settings={key: value for key, value in flatten(config.to_dict()).items()
                  if key not in ("name", "description", "run.output_dir")},
        held_out=held_out,
        evaluation=evaluation if records is None else None,
    )


def unique_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Directory names, with the parent's name prepended where two runs share a name."""
    names = [path.name for path in run_dirs]
    return [f"{path.parent.name}/{path.name}" if names.count(path.name) > 1 else path.name
            for path in run_dirs]


def evaluation_numbers(evaluation: int | Sequence[int] | None, count: int
                       ) -> list[int | None]:
    """One record number (or ``None``: the latest evaluations) for each of ``count`` run
    directories: ``evaluation`` given once holds for all of them; a sequence names one per
    directory, in order."""
    if evaluation is None or isinstance(evaluation, int):
        numbers = [evaluation] * count
    else:
        numbers = list(evaluation)
        if len(numbers) == 1:
            numbers *= count
        elif len(numbers) != count:
            raise RunError(f"compare: --evaluation names {len(numbers)} records for {count} "
                           "run directories; give one number for all of them or one per "
                           "run directory")
    for number in numbers:
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)
                                   or number < 1):
            raise RunError(f"compare: --evaluation must be record numbers of 1 or more "
                           f"(evaluations/<N>.json), got {number!r}")
    return numbers


def compare_runs(run_dirs: Sequence[str | Path],
                 evaluation: int | Sequence[int] | None = None) -> Comparison:
    """Summaries of ``run_dirs`` and the settings that are not the same in all of them; a
    parent of replicated evolutions (:mod:`metarl.evolve.replicated`) stands for its
    seeds. ``evaluation``: which record ``evaluations/<N>.json`` of each run the held-out
    scores come from, one number for all runs or one per entry of ``run_dirs`` (a parent's
    number holds for each of its seeds); by default every record, the latest of each
    environment and objective winning."""
    if len(run_dirs) < 1:
        raise RunError("compare: give at least one run directory")
    numbers = evaluation_numbers(evaluation, len(run_dirs))
    paths, chosen = [], []
    for run_dir, number in zip(run_dirs, numbers, strict=True):
        expanded = expand_replicates([run_dir])
        paths += expanded
        chosen += [number] * len(expanded)
    if not paths:
        raise RunError("compare: the parents given hold no seed directory yet")
    runs = tuple(summarise_run(p, label, evaluation=number)
                 for p, label, number in zip(paths, unique_labels(paths), chosen, strict=True))
    keys = sorted(set().union(*(run.settings for run in runs)))
    differing = {}
    for key in keys:
        values = [run.settings.get(key) for run in runs]
        if any(json.dumps(v) != json.dumps(values[0]) for v in values):
            differing[key] = values
    return Comparison(runs, differing)


def format_comparison(comparison: Comparison, pooled: list[PooledVerdict] | None = None,
                      between: list[RunVerdict] | None = None) -> str:
    """Plain-text tables: what each run reached, its evaluations, the evolved objective
    against each baseline (``pooled``: :func:`pooled_verdicts`), the runs against each other
    (``between``: :func:`between_runs`; each computed when not given), and the settings that
    differ."""
    rows = [("run", "objective", "generations", "best fitness", "last mean fitness")]
    rows += [(r.label, r.objective, str(r.generations), f"{r.best_fitness:.4g}",
              f"{r.final_mean_fitness:.4g}") for r in comparison.runs]
    blocks = [_table(rows)]
    evaluated = [(r.label, *row) for r in comparison.runs for row in r.evaluations]
    if evaluated:
        rows = [("run", "environment", "objective", "mean", "95% CI")]
        rows += [(label, env, objective, f"{mean:.2f}", f"[{low:.2f}, {high:.2f}]")
                 for label, env, objective, mean, low, high in evaluated]
        blocks.append(_table(rows))
    pooled = pooled_verdicts(comparison) if pooled is None else pooled
    seeds_line = held_out_seeds(comparison)
    marked = False
    if pooled:
        rows = [("environment", "objective", "vs baseline", *OUTCOMES, "runs",
                 "IQM objective", "IQM baseline", "P(improvement)", "verdict (all runs)")]
        for p in pooled:
            mark = SEEN_MARK if _seen(comparison, p.env_id, p.evolved, p.baseline) else ""
            marked |= bool(mark)
            rows.append((p.env_id, p.evolved, p.baseline,
                         *(str(p.counts[o]) for o in OUTCOMES), str(p.runs),
                         _estimate(p.evolved_iqm), _estimate(p.baseline_iqm),
                         _estimate(p.probability), p.outcome + mark))
        blocks.append(
            "evolved objective against each baseline: runs judged better / no difference "
            "found / worse (the 95% interval of P(improvement) over the run's held-out seeds "
            "lies wholly above 0.5 / contains it / lies wholly below), and all runs together "
            "(IQM over runs x seeds; P(improvement) over runs x seeds, resampling held-out "
            "seeds where the runs share them; intervals 95%); " + seeds_line + "\n"
            + _table(rows))
    between = between_runs(comparison) if between is None else between
    if between:
        rows = [("environment", "objective", "run", "vs run", "P(improvement)", "paired",
                 "verdict")]
        for v in between:
            mark = SEEN_MARK if _seen(comparison, v.env_id, v.objective, v.objective,
                                      runs=(v.first, v.second)) else ""
            marked |= bool(mark)
            rows.append((v.env_id, v.objective, v.first, v.second,
                         _estimate(Estimate(v.probability, v.low, v.high)),
                         "yes" if v.paired else "no", v.outcome + mark))
        blocks.append("the runs' evolved objectives against each other (P(improvement) of "
                      "the run over the other, 95% interval); " + seeds_line + "\n"
                      + _table(rows))
    if marked:
        blocks.append(f"{SEEN_MARK.strip()} {SEEN_NOTE} (a record with eval_seed_reused)")
    if comparison.differing:
        rows = [("setting", *[r.label for r in comparison.runs])]
        rows += [(key, *[json.dumps(v) for v in values])
                 for key, values in comparison.differing.items()]
        blocks.append(_table(rows))
    else:
        blocks.append("every setting is the same in all runs")
    return "\n\n".join(blocks)


def held_out_seeds(comparison: Comparison) -> str:
    """How many held-out seeds the compared records used and their roots, in words."""
    used = sorted({(len(h.scores), h.eval_seed) for run in comparison.runs
                   for h in run.held_out.values()},
                  key=lambda pair: (pair[0], -1 if pair[1] is None else pair[1]))
    if not used:
        return "no held-out seeds"
    return "held-out seeds: " + "; ".join(
        f"{count} from root {'unrecorded' if root is None else root}" for count, root in used)


def _seen(comparison: Comparison, env_id: str, evolved: str, baseline: str,
          runs: Sequence[str] | None = None) -> bool:
    """Whether any compared record behind a verdict (of ``runs``, default every run) was
    judged on held-out seeds an earlier evaluation had used."""
    return any(held.seen for run in comparison.runs if runs is None or run.label in runs
               for key in ((env_id, evolved), (env_id, baseline))
               if (held := run.held_out.get(key)) is not None)


def _estimate(estimate: Estimate) -> str:
    return f"{estimate.value:.2f} [{estimate.low:.2f}, {estimate.high:.2f}]"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def plot_comparison(comparison: Comparison, pooled: list[PooledVerdict] | None = None
                    ) -> dict[str, Any]:
    """``{file stem: Figure}``: the mean and best-so-far fitness of every run over
    generations (``fitness``), the held-out evaluations of the runs that have any
    (``evaluations``), the performance profiles of the evolved objective and each baseline
    over runs x held-out seeds (``performance_profiles``, :func:`profile_panels`) and, when
    all runs evolved the same objective, what its registered ``plot`` draws of every run's
    search mean at once. ``pooled``: :func:`pooled_verdicts`, computed when not given."""
    from metarl.figures.records import (
        plot_evaluation_intervals,
        plot_fitness_overlay,
        plot_performance_profiles,
    )

    figures = {"fitness": plot_fitness_overlay(
        {run.label: read_metrics(run.run_dir) for run in comparison.runs})}
    evaluated = {run.label: run.evaluations for run in comparison.runs if run.evaluations}
    if evaluated:
        figures["evaluations"] = plot_evaluation_intervals(evaluated)
    panels = profile_panels(comparison, pooled)
    if panels:
        figures["performance_profiles"] = plot_performance_profiles(panels)

    objectives = {run.objective for run in comparison.runs}
    if len(objectives) != 1:
        return figures
    plot = get_objective(objectives.pop()).plot
    if plot is None:
        return figures
    first = read_config(comparison.runs[0].run_dir, config_from_dict)
    candidates = {}
    for run in comparison.runs:
        if (run.run_dir / MEAN_FILE).is_file():
            config = read_config(run.run_dir, config_from_dict)
            template = config.objective.build().init(jax.random.PRNGKey(0))
            candidates[run.label] = read_meta_params(run.run_dir / MEAN_FILE, template)
    request = RunFigureRequest(
        run_name=f"{len(candidates)} runs", candidates=candidates,
        options=dict(first.objective.options), inner=first.inner[0],
        generation=max(run.generations for run in comparison.runs))
    for stem, figure in plot(request).items():
        figures[_safe_stem(stem)] = figure
    return figures


def profile_panels(comparison: Comparison, pooled: list[PooledVerdict] | None = None
                   ) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """The data of the performance-profile figure: one panel per (environment, evolved,
    baseline) of :func:`pooled_verdicts`, ``{title: {objective: {"thresholds": [K],
    "fraction": [K], "low": [K], "high": [K]}}}``: the fraction of runs x held-out seeds
    scoring above each threshold, with its 95% band (:func:`metarl.stats.performance_profile`).
    """
    pooled = pooled_verdicts(comparison) if pooled is None else pooled
    panels = {}
    for p in pooled:
        thresholds = profile_thresholds(p.evolved_scores, p.baseline_scores)
        profiles = performance_profile({p.evolved: p.evolved_scores,
                                        p.baseline: p.baseline_scores}, thresholds)
        if profiles:
            title = (f"{p.env_id}: {p.evolved} vs {p.baseline} ({p.runs} runs, "
                     f"{p.evolved_scores.size} and {p.baseline_scores.size} seeds)")
            panels[title] = {name: {"thresholds": profile.thresholds,
                                    "fraction": profile.fraction, "low": profile.low,
                                    "high": profile.high}
                             for name, profile in profiles.items()}
    return panels


def _safe_stem(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)


def comparison_data(comparison: Comparison, pooled: list[PooledVerdict] | None = None,
                    between: list[RunVerdict] | None = None) -> dict[str, Any]:
    """The verdicts of ``comparison`` as plain data: the runs (directory, label, the
    evaluation record read or ``None`` for the latest), every
    run's evolved objective against its baselines (``verdicts``), all runs together
    (``pooled``; estimates as ``{value, low, high}``), the runs against each other
    (``between_runs``) and the settings that differ. ``pooled`` and ``between`` are
    computed when not given."""
    pooled = pooled_verdicts(comparison) if pooled is None else pooled
    between = between_runs(comparison) if between is None else between
    return {
        "runs": [{"run_dir": str(run.run_dir), "label": run.label,
                  "evaluation": run.evaluation} for run in comparison.runs],
        "verdicts": [dataclasses.asdict(v) for v in verdicts(comparison)],
        "pooled": [{"env_id": p.env_id, "evolved": p.evolved, "baseline": p.baseline,
                    "counts": p.counts, "evolved_iqm": p.evolved_iqm.to_dict(),
                    "baseline_iqm": p.baseline_iqm.to_dict(),
                    "probability": p.probability.to_dict(), "paired": p.paired,
                    "outcome": p.outcome} for p in pooled],
        "between_runs": [dataclasses.asdict(v) for v in between],
        "differing": comparison.differing,
    }


def save_comparison(comparison: Comparison, out_dir: str | Path,
                    pooled: list[PooledVerdict] | None = None,
                    between: list[RunVerdict] | None = None) -> list[Path]:
    """Write ``comparison.txt``, its verdicts as ``comparison.json`` (:func:`comparison_data`)
    and the figures of :func:`plot_comparison` to ``out_dir`` (``pooled``:
    :func:`pooled_verdicts`, ``between``: :func:`between_runs`; each computed when not
    given)."""
    from metarl.figures.style import save_png

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pooled = pooled_verdicts(comparison) if pooled is None else pooled
    between = between_runs(comparison) if between is None else between
    (out / "comparison.txt").write_text(format_comparison(comparison, pooled, between) + "\n")
    (out / "comparison.json").write_text(
        json.dumps(comparison_data(comparison, pooled, between), indent=1) + "\n")
    written = [out / "comparison.txt", out / "comparison.json"]
    for stem, figure in plot_comparison(comparison, pooled).items():
        written.append(save_png(figure, out / f"{stem}.png"))
    return written
