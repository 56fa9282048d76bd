"""PBT against the same population with its hyperparameters fixed, on held-out seeds.

For a ``kind = "pbt"`` experiment file and each held-out seed (``1000 .. 1000 + --seeds``),
the population that ``metarl run FILE --set run.seed=SEED`` would start from (same
hyperparameter draws, same initial states, same segment keys) is trained in each arm with
the same environment steps:

- ``pbt``: exploit and explore after every segment but the last, as the file says (the
  segments of ``metarl run``);
- ``fixed``: the same segments with exploit disabled, so every member keeps the
  hyperparameters it was drawn with;
- ``tuned`` (unless ``--no-tuned``): the same segments with exploit disabled, every member
  training with one tuned setting of the hyperparameters that have priors in place of its
  own draws (its initial state and keys stay its own, so the members still differ).

The tuned setting is chosen on tuning seeds ``2000 .. 2000 + --tune-seeds`` (default 1),
disjoint from the held-out ones. Each tuning seed's population trained with exploit
disabled is a random search: ``P`` settings drawn from the priors, each trained for the
whole budget. With one tuning seed the search costs ``P`` full training runs, what one PBT
population trains: PBT adapts its hyperparameters within that budget, the tuned arm spends
it searching before it trains (more tuning seeds give it more). The chosen setting is the
candidate with the best final score (below) over all tuning seeds, ties broken by the
larger area under its training-return curve (its mean over segments); NaN ranks last. The
tuned arm then measures that setting on the held-out seeds, where the choice cannot have
flattered it.

``--reseed both`` adds an arm, PBT with ``pbt.reseed_copies`` flipped, to choose that
setting on evidence. All seeds' populations of an arm run as one vmapped program, and all
arms share it: one compilation per ``reseed_copies`` value (hyperparameters are traced
arrays, so the tuned values compile nothing; the tuning seeds, another number of
populations, compile once more).

Scores, per seed: the final best member's return and the population's median final
return. With a deterministic evaluation (DQN, TD3, SAC: ``Learner.evaluate``) every final
member plays ``inner.eval_episodes`` greedy / mean-action episodes (the same keys in every
arm); PPO has none, so its score is each member's training return over the last segment
(the mean episode return of its last ``pbt.fitness_window`` updates, PBT's own fitness).
Also per seed: the area under the population's median training-return curve (its mean over
segments) and the environment steps per member until that median first reaches
``--threshold`` (default 475 on CartPole-v1, -200 on Pendulum-v1; a seed that never reaches
it counts as the whole budget). The report gives each arm's mean over seeds with a 95%
bootstrap interval and the paired differences ``pbt - fixed`` and ``pbt - tuned`` (a
bootstrap over seeds of the per-seed differences). ``tuning`` in the report lists the
tuning seeds, every candidate setting with its final score and area, and the one chosen.

    python experiments/pbt_vs_fixed.py                      # pbt_ppo_cartpole.toml, 8 seeds
    python experiments/pbt_vs_fixed.py --reseed both        # also PBT with reseed_copies flipped
    python experiments/pbt_vs_fixed.py --tune-seeds 2       # tuned on 2 x P drawn settings
    python experiments/pbt_vs_fixed.py --config experiments/pbt_sac_pendulum.toml \\
        --out docs/results/pbt_vs_fixed_sac_pendulum.json
    python experiments/pbt_vs_fixed.py --seeds 2 --set inner.total_timesteps=16384 --out /tmp/p.json

Prints one JSON document and writes it to ``--out`` (default
``docs/results/pbt_vs_fixed_ppo_cartpole.json``), with ``<out>_curves.png`` beside it: the
population's median and best training return after every segment, mean over seeds, per
arm.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

import metarl
from inner_loops.registry import make_learner
from metarl.kinds import config_kind, load_experiment
from metarl.population.pbt import PBTConfig, initial_population, make_segment
from metarl.stats import aggregate

FIRST_SEED = 1000  # held out: the experiment files and their development used seeds 0-9
TUNING_FIRST_SEED = 2000  # the tuned arm's setting is chosen on these, apart from the held out
EVAL_SEED = 10_007  # the evaluation keys of `metarl evaluate`
INIT_HYPERS = ("init_alpha",)  # read by a learner's init (SAC's temperature), not only after
THRESHOLDS = {"CartPole-v1": 475.0, "Pendulum-v1": -200.0}


# --------------------------------------------------------------------------------------
# statistics


def _interval(values) -> tuple[float, float]:
    """The 95% bootstrap interval of the mean of ``values [S]``."""
    mean = aggregate(values, "mean")
    return mean.low, mean.high


def summary(values) -> dict:
    """Mean over seeds with its 95% bootstrap interval, and the per-seed values."""
    values = np.asarray(values, np.float64)
    mean = aggregate(values, "mean")
    return {"mean": float(values.mean()), "ci95": [mean.low, mean.high],
            "per_seed": [round(float(v), 2) for v in values]}


def paired(a, b) -> dict:
    """``a - b`` seed by seed: the mean difference, its 95% bootstrap interval (resampling
    seeds, so each resample keeps a seed's two arms together) and on how many seeds ``a`` is
    above, equal to or below ``b``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    difference = a - b
    mean = aggregate(difference, "mean")
    return {"mean": float(difference.mean()), "ci95": [mean.low, mean.high],
            "per_seed": [round(float(v), 2) for v in difference],
            "seeds_above": int((difference > 0).sum()),
            "seeds_equal": int((difference == 0).sum()),
            "seeds_below": int((difference < 0).sum())}


def steps_to_reach(curves, threshold: float, steps) -> tuple[np.ndarray, np.ndarray]:
    """For curves ``[S, G]`` sampled at ``steps [G]``: the steps at the first point of each
    curve at or above ``threshold``, and whether it got there; a curve that never does
    counts as ``steps[-1]`` (censored at the budget)."""
    curves, steps = np.asarray(curves, np.float64), np.asarray(steps)
    above = curves >= threshold  # NaN is never above
    reached = above.any(axis=1)
    first = np.where(reached, above.argmax(axis=1), len(steps) - 1)
    return steps[first], reached


# --------------------------------------------------------------------------------------
# training


def seed_lists(held_out: int, tuning: int) -> tuple[list[int], list[int]]:
    """The held-out seeds ``FIRST_SEED ..`` and the tuning seeds ``TUNING_FIRST_SEED ..``;
    ``ValueError`` where they would overlap."""
    seeds = list(range(FIRST_SEED, FIRST_SEED + held_out))
    tune = list(range(TUNING_FIRST_SEED, TUNING_FIRST_SEED + tuning))
    if set(seeds) & set(tune):
        raise ValueError(f"{held_out} held-out seeds from {FIRST_SEED} reach the tuning seeds "
                         f"from {TUNING_FIRST_SEED}; use at most "
                         f"{TUNING_FIRST_SEED - FIRST_SEED}")
    return seeds, tune


def best_setting(final, area) -> int:
    """The index of the best candidate of ``final [N]`` scores: the highest score, ties
    broken by the larger ``area [N]``, then by the lower index; NaN ranks last in both."""
    final, area = (np.where(np.isnan(x), -np.inf, np.asarray(x, np.float64))
                   for x in (final, area))
    return int(np.lexsort((-area, -final))[0])  # lexsort sorts by its last key first


def member_scores(fitness) -> tuple[np.ndarray, np.ndarray]:
    """Best and median member of each population ``[..., P] -> [...]``; NaN members (no
    finished episode, or diverged) count as the worst."""
    fitness = np.where(np.isnan(fitness), -np.inf, np.asarray(fitness, np.float64))
    return fitness.max(axis=-1), np.median(fitness, axis=-1)


class Population:
    """The vmapped programs of one :class:`PBTConfig` over seeds: the initial population
    and one segment (its ``exploit`` flag is an argument, so PBT and fixed arms share the
    compilation)."""

    def __init__(self, learner, config: PBTConfig, chunk_size):
        self.learner, self.config = learner, config
        self.init = jax.jit(jax.vmap(
            lambda key: initial_population(learner, config, key, chunk_size)))
        self.segment = jax.jit(jax.vmap(make_segment(learner, config, chunk_size),
                                        in_axes=(0, 0, 0, None)))
        self.evaluate = None
        if learner.evaluate_fn is not None:
            member_keys = jax.random.split(jax.random.PRNGKey(EVAL_SEED),
                                           config.population_size)
            per_population = jax.vmap(lambda s, k: learner.evaluate(s, k)["eval_return"])
            self.evaluate = jax.jit(jax.vmap(lambda states: per_population(states,
                                                                           member_keys)))

    def train(self, seeds: list[int], segments: int, exploit: bool,
              hypers_override: dict[str, float] | None = None) -> dict:
        """Every seed's population over ``segments`` segments, as ``metarl run`` would with
        ``run.seed = seed`` (exploit after every segment but the last when ``exploit``).
        ``hypers_override`` (prior name -> value) replaces those drawn hyperparameters of
        every member by one value, leaving the initial states as drawn.

        Returns ``fitness [S, G, P]``, ``final [S, P]`` scores, ``replaced [S, G]`` copies,
        the final ``hypers`` (prior name -> ``[S][P]`` lists) and timings."""
        started = time.perf_counter()
        init_keys, run_keys = jnp.stack(
            [jax.random.split(jax.random.PRNGKey(seed)) for seed in seeds], axis=1)
        segment_keys = jax.vmap(lambda key: jax.random.split(key, segments))(run_keys)
        states, hypers = self.init(init_keys)
        if hypers_override:
            self.check_override(hypers_override)
            # same shapes and dtypes as the draws: the compiled segment serves them
            hypers = hypers._replace(**{
                name: jnp.full_like(getattr(hypers, name), value)
                for name, value in hypers_override.items()})
        label = "pbt" if exploit else "tuned" if hypers_override else "fixed"
        fitness, replaced, seconds = [], [], []
        for index in range(segments):
            flag = jnp.asarray(exploit and index < segments - 1)
            states, hypers, _, scores, record = self.segment(
                states, hypers, segment_keys[:, index], flag)
            fitness.append(np.asarray(scores))  # [S, P]; waits for the segment
            replaced.append(np.asarray(record.replaced).sum(axis=1))
            seconds.append(time.perf_counter() - started)
            print(f"{label} segment {index + 1}/{segments}: "
                  f"{seconds[-1]:.1f} s", file=sys.stderr, flush=True)
        fitness = np.stack(fitness, axis=1)  # [S, G, P]
        if self.evaluate is not None:
            final = np.asarray(self.evaluate(states), np.float64)  # [S, P]
        else:
            final = fitness[:, -1]
        return {"fitness": fitness, "final": final, "replaced": np.stack(replaced, axis=1),
                "hypers": {name: np.asarray(values).tolist()
                           for name, values in jax.device_get(hypers)._asdict().items()
                           if name in self.config.priors},
                "seconds": time.perf_counter() - started,
                "first_segment_seconds": seconds[0]}

    def check_override(self, override: dict[str, float]) -> None:
        unknown = sorted(set(override) - set(self.config.priors))
        if unknown:
            raise ValueError(f"hypers_override: {', '.join(unknown)} has no prior; the "
                             f"priors are {', '.join(sorted(self.config.priors))}")
        read_at_init = sorted(set(override) & set(INIT_HYPERS))
        if read_at_init:
            raise ValueError(f"hypers_override: {', '.join(read_at_init)} sets the initial "
                             "state, which was built with the drawn value")


def tune(population: Population, seeds: list[int], segments: int) -> dict:
    """Choose one setting of the prior-drawn hyperparameters: every member of ``seeds``'
    populations trained with exploit disabled is a candidate (``len(seeds) * P``, seed by
    seed), and :func:`best_setting` of their final scores and areas (mean training return
    over the segments) picks one.

    Returns ``seeds``, ``candidates`` (name -> ``[N]`` values), their ``scores [N]`` and
    ``areas [N]``, the ``chosen`` setting (name -> value), its index, score and area."""
    arm = population.train(seeds, segments, exploit=False)
    scores = arm["final"].reshape(-1)
    areas = arm["fitness"].mean(axis=1).reshape(-1)  # [S, G, P] -> [S * P]
    candidates = {name: [float(v) for row in values for v in row]
                  for name, values in arm["hypers"].items()}  # never explored: as drawn
    index = best_setting(scores, areas)
    return {"seeds": seeds,
            "candidates": candidates,
            "scores": [float(v) for v in scores],  # unrounded: the choice can be checked
            "areas": [float(v) for v in areas],
            "chosen": {name: values[index] for name, values in candidates.items()},
            "chosen_index": index,
            "chosen_score": float(scores[index]),
            "chosen_area": float(areas[index]),
            "seconds": round(arm["seconds"], 1)}


# --------------------------------------------------------------------------------------
# report and figure


ARM_STYLE = {"pbt": "C3", "fixed": "C0", "tuned": "C2"}


def plot_curves(steps, arms: dict[str, dict], title: str) -> Figure:
    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.subplots()
    for index, (name, arm) in enumerate(arms.items()):
        colour = ARM_STYLE.get(name, f"C{index + 2}")
        best, median = member_scores(arm["fitness"])  # [S, G]
        seeds = best.shape[0]
        for curves, style, what in ((median, "-", "median"), (best, "--", "best")):
            mean = curves.mean(axis=0)
            ax.plot(steps, mean, style, color=colour,
                    label=f"{name}: population {what}, mean of {seeds} seeds")
            if what == "median":
                bands = np.array([_interval(curves[:, g]) for g in range(curves.shape[1])])
                ax.fill_between(steps, bands[:, 0], bands[:, 1], color=colour, alpha=0.15)
    ax.set_xlabel("environment steps per member")
    ax.set_ylabel("training return (last updates of each segment)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def arm_report(arm: dict, steps, threshold: float | None) -> dict:
    best, median = member_scores(arm["final"])
    _, median_curve = member_scores(arm["fitness"])
    report = {"final_best": summary(best), "final_median": summary(median),
              "auc_median": summary(median_curve.mean(axis=1))}
    if threshold is not None:
        reached_at, reached = steps_to_reach(median_curve, threshold, steps)
        report["steps_to_threshold"] = {**summary(reached_at),
                                        "reached": int(reached.sum())}
    best_curve = member_scores(arm["fitness"])[0]
    report["curves"] = {  # mean over seeds, then each seed's
        "median": [round(float(v), 2) for v in median_curve.mean(axis=0)],
        "best": [round(float(v), 2) for v in best_curve.mean(axis=0)],
        "median_per_seed": np.round(median_curve, 2).tolist(),
        "best_per_seed": np.round(best_curve, 2).tolist(),
    }
    report["copies_per_segment"] = [round(float(v), 2) for v in arm["replaced"].mean(axis=0)]
    report["final_hypers_first_seed"] = {name: [float(f"{v:.4g}") for v in values[0]]
                                         for name, values in arm["hypers"].items()}
    report["seconds"] = round(arm["seconds"], 1)
    report["first_segment_seconds"] = round(arm["first_segment_seconds"], 1)
    return report


def differences(a: dict, b: dict, steps, threshold: float | None) -> dict:
    best_a, median_a = member_scores(a["final"])
    best_b, median_b = member_scores(b["final"])
    auc_a, auc_b = (member_scores(arm["fitness"])[1].mean(axis=1) for arm in (a, b))
    report = {"final_best": paired(best_a, best_b), "final_median": paired(median_a, median_b),
              "auc_median": paired(auc_a, auc_b)}
    if threshold is not None:
        reach_a, reach_b = (steps_to_reach(member_scores(arm["fitness"])[1], threshold,
                                           steps)[0] for arm in (a, b))
        report["steps_to_threshold"] = paired(reach_a, reach_b)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/pbt_ppo_cartpole.toml")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--reseed", choices=("config", "true", "false", "both"),
                        default="config",
                        help="pbt.reseed_copies of the pbt arm (as the file says by default); "
                             "both: the file's value, plus an arm with it flipped")
    parser.add_argument("--tune-seeds", type=int, default=1,
                        help="tuning seeds from 2000 for the tuned arm: each is a random "
                             "search of population_size settings from the priors")
    parser.add_argument("--no-tuned", dest="tuned", action="store_false",
                        help="skip the tuning and the tuned arm")
    parser.add_argument("--threshold", type=float, default=None,
                        help="return the median curve is timed to (default by environment)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field of the file, as `metarl run --set`")
    parser.add_argument("--out", default="docs/results/pbt_vs_fixed_ppo_cartpole.json")
    args = parser.parse_args()
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts

    experiment = load_experiment(args.config, args.set)
    if config_kind(experiment) != "pbt":
        parser.error(f"--config: {args.config} is a {config_kind(experiment)!r} experiment, "
                     "not a pbt one")
    pbt = experiment.pbt
    if args.reseed in ("true", "false"):
        pbt = dataclasses.replace(pbt, reseed_copies=args.reseed == "true")
    learner = make_learner(experiment.inner)
    segments = experiment.num_segments
    per_segment = pbt.segment_updates * learner.steps_per_update
    steps = np.arange(1, segments + 1) * per_segment
    env_id = experiment.inner.env_id
    threshold = args.threshold if args.threshold is not None else THRESHOLDS.get(env_id)
    if args.tune_seeds < 1:
        parser.error("--tune-seeds: use at least 1")
    try:
        seeds, tuning_seeds = seed_lists(args.seeds, args.tune_seeds if args.tuned else 0)
    except ValueError as error:
        parser.error(f"--seeds: {error}")
    chunk_size = experiment.run.chunk_size

    population = Population(learner, pbt, chunk_size)
    arms = {"pbt": population.train(seeds, segments, exploit=True),
            "fixed": population.train(seeds, segments, exploit=False)}
    if args.reseed == "both":
        flipped = dataclasses.replace(pbt, reseed_copies=not pbt.reseed_copies)
        other = f"pbt_reseed_copies_{str(flipped.reseed_copies).lower()}"
        arms[other] = Population(learner, flipped, chunk_size).train(seeds, segments, True)
    if args.tuned:
        tuning = tune(population, tuning_seeds, segments)
        compiled = population.segment._cache_size()
        arms["tuned"] = population.train(seeds, segments, exploit=False,
                                         hypers_override=tuning["chosen"])
        if population.segment._cache_size() != compiled:
            print("warning: the tuned arm compiled the segment again", file=sys.stderr)

    algorithm = type(experiment.inner).__name__.removesuffix("Config")
    method = ("deterministic" if learner.evaluate_fn is not None else
              f"training return over the last {pbt.fitness_window} updates")
    report = {
        "config": args.config,
        "overrides": args.set,
        "algorithm": algorithm,
        "env": env_id,
        "seeds": seeds,
        "population_size": pbt.population_size,
        "segments": segments,
        "environment_steps_per_member": int(steps[-1]),
        "pbt": {"reseed_copies": pbt.reseed_copies, "exploit_fraction": pbt.exploit_fraction,
                "explore": pbt.explore, "segment_updates": pbt.segment_updates,
                "fitness_window": pbt.fitness_window, "priors": sorted(pbt.priors)},
        "final_score": method,
        "eval_episodes": getattr(experiment.inner, "eval_episodes", None)
        if learner.evaluate_fn is not None else None,
        "threshold": threshold,
        "arms": {name: arm_report(arm, steps, threshold) for name, arm in arms.items()},
        "pbt_minus_fixed": differences(arms["pbt"], arms["fixed"], steps, threshold),
        **({"pbt_minus_tuned": differences(arms["pbt"], arms["tuned"], steps, threshold),
            "tuning": tuning} if args.tuned else {}),
        "steps": steps.tolist(),
        "device": jax.devices()[0].device_kind,
        "devices": jax.device_count(),
    }
    if args.reseed == "both":
        reseeded, plain = ("pbt", other) if pbt.reseed_copies else (other, "pbt")
        report["reseed_minus_no_reseed"] = differences(arms[reseeded], arms[plain], steps,
                                                       threshold)
        report["reseed_arms"] = {"reseed_copies_true": reseeded, "reseed_copies_false": plain}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2)
    out.write_text(text + "\n")
    title = (f"{env_id}: {pbt.population_size} {algorithm} members, PBT vs fixed "
             f"{'and tuned ' if args.tuned else ''}hyperparameters, seeds "
             f"{seeds[0]}-{seeds[-1]}\n(lines: mean over seeds; "
             "band: 95% bootstrap interval of the median's mean)")
    plot_curves(steps, arms, title).savefig(out.with_name(f"{out.stem}_curves.png"), dpi=90)
    print(text)


if __name__ == "__main__":
    main()
