"""CEM-RL against TD3 alone on Pendulum-v1, with the same environment steps.

Both train on the same held-out seeds with the same TD3 settings (networks 64-64, the rest
TD3Config's Pendulum defaults, replay capacity 50 000):

- ``td3``: one TD3 agent per seed, ``--generations x population x 200`` environment steps;
- ``cem_rl``: CEM-RL with ``--population`` actors (half of them RL actors, half of them
  elites), one 200-step evaluation episode per actor and generation, ``--generations``
  generations: the same number of environment steps. Its result is the distribution's
  mean actor.

Both final policies run the same 20 deterministic evaluation episodes (same keys); the
report gives each method's mean over seeds with a 95% bootstrap interval, and the paired
difference CEM-RL - TD3 with its interval. Learning curves: the deterministic return at
every ``2 x population x 200`` steps (TD3 evaluated between segments; CEM-RL's mean actor
at the end of every other generation).

    python experiments/cem_rl_pendulum.py                      # 8 seeds, 16 generations
    python experiments/cem_rl_pendulum.py --seeds 2 --generations 4 --out /tmp/c.json

Prints one JSON document and writes it to ``--out`` (default
``docs/results/cem_rl_pendulum.json``), with ``.png`` figures beside it: the learning
curves, and the CEM-RL history (fitness, RL vs CEM actors) of the first seed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

import metarl
from inner_loops.td3 import TD3Config, build
from metarl.figures.population import plot_cem_rl
from metarl.population.cem_rl import CEMRLConfig, generation_record, make_cem_rl
from metarl.stats import aggregate

FIRST_SEED = 1000  # held out: development used seeds 0-9
EVAL_EPISODES = 20
EPISODE_STEPS = 200


def _interval(values) -> tuple[float, float]:
    """The 95% bootstrap interval of the mean of ``values [S]``."""
    mean = aggregate(values, "mean")
    return mean.low, mean.high


def summary(values) -> dict:
    values = np.asarray(values, np.float64)
    mean = aggregate(values, "mean")
    return {"mean": float(values.mean()), "ci95": [mean.low, mean.high],
            "per_seed": [round(float(v), 1) for v in values]}


def train_td3(inner: TD3Config, seeds: list[int], segments: int) -> tuple[np.ndarray, float]:
    """``[S, segments]`` deterministic returns after each of ``segments`` equal segments."""
    learner = build(inner)
    updates = learner.num_updates // segments
    keys = jnp.stack([jax.random.PRNGKey(seed) for seed in seeds])
    eval_keys = jax.random.split(jax.random.PRNGKey(7), len(seeds))
    started = time.perf_counter()
    states = jax.jit(jax.vmap(learner.init))(keys)
    advance = jax.jit(jax.vmap(lambda s: learner.advance(s, num_updates=updates)[0]))
    evaluate = jax.jit(jax.vmap(lambda s, k: learner.evaluate_fn(s, k)["eval_return"]))
    curve = []
    for _ in range(segments):
        states = advance(states)
        curve.append(np.asarray(evaluate(states, eval_keys)))
    return np.stack(curve, axis=1), time.perf_counter() - started


def train_cem_rl(config: CEMRLConfig, seeds: list[int]) -> tuple[np.ndarray, list, float]:
    """``[S, G]`` the mean actor's deterministic return after every generation (on the
    evaluation keys of :func:`train_td3`), and the first seed's history."""
    run = make_cem_rl(config)
    keys = jnp.stack([jax.random.PRNGKey(seed) for seed in seeds])
    eval_keys = jax.random.split(jax.random.PRNGKey(7), len(seeds))
    started = time.perf_counter()
    states = jax.jit(jax.vmap(run.init))(keys)
    generation = jax.jit(jax.vmap(run.generation, in_axes=(0, None)))
    evaluate = jax.jit(jax.vmap(lambda s, k: run.parts.evaluate(run.mean_actor(s), k,
                                                                EVAL_EPISODES)))
    curve, history = [], []
    for _ in range(config.generations):
        states, metrics = generation(states, run.hyperparams())
        curve.append(np.asarray(evaluate(states, eval_keys)))
        history.append(generation_record(jax.tree.map(lambda m: m[0], metrics),
                                         config.num_elites))
    return np.stack(curve, axis=1), history, time.perf_counter() - started


def plot_curves(steps_td3, td3, steps_cem, cem) -> Figure:
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.subplots()
    for steps, curves, label, colour in ((steps_td3, td3, "TD3", "C0"),
                                         (steps_cem, cem, "CEM-RL (mean actor)", "C3")):
        mean = curves.mean(axis=0)
        bands = np.array([_interval(curves[:, i]) for i in range(curves.shape[1])])
        ax.plot(steps, mean, color=colour, label=f"{label}, mean of {curves.shape[0]} seeds")
        ax.fill_between(steps, bands[:, 0], bands[:, 1], color=colour, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"deterministic return ({EVAL_EPISODES} episodes)")
    ax.set_title("Pendulum-v1: CEM-RL vs TD3 (95% bootstrap bands)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--generations", type=int, default=16)
    parser.add_argument("--population", type=int, default=6)
    parser.add_argument("--out", default="docs/results/cem_rl_pendulum.json")
    args = parser.parse_args()
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts
    if args.generations % 2:
        parser.error("--generations: must be even (TD3 is evaluated every 2 generations)")

    steps = args.generations * args.population * EPISODE_STEPS
    inner = TD3Config(env_id="Pendulum-v1", actor_hidden_sizes=(64, 64),
                      critic_hidden_sizes=(64, 64), buffer_size=50_000,
                      total_timesteps=steps, eval_episodes=EVAL_EPISODES)
    if inner.steps_per_agent != steps or inner.num_updates % (args.generations // 2):
        parser.error(f"{steps} steps are not a whole number of TD3 segments of "
                     f"{inner.steps_per_update}-step updates")
    config = CEMRLConfig(inner=inner, population_size=args.population,
                         num_elites=args.population // 2, generations=args.generations)
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.seeds))

    cem_curve, history, cem_seconds = train_cem_rl(config, seeds)
    td3_curve, td3_seconds = train_td3(inner, seeds, args.generations // 2)
    per_generation = args.population * EPISODE_STEPS
    td3_steps = np.arange(1, args.generations // 2 + 1) * 2 * per_generation
    cem_steps = np.arange(1, args.generations + 1) * per_generation
    final_td3, final_cem = td3_curve[:, -1], cem_curve[:, -1]
    difference = final_cem - final_td3
    low, high = _interval(difference)
    report = {
        "env": "Pendulum-v1",
        "environment_steps": steps,
        "seeds": seeds,
        "settings": {
            "td3": "TD3Config defaults for Pendulum-v1 (4 envs x 8 steps per update, 32 "
                   "gradient steps, batch 256, learning_starts 1000, lr 1e-3, gamma 0.98, "
                   "tau 0.005, noise 0.1/0.2/0.5, delay 2) with 64-64 networks, buffer 50000",
            "cem_rl": f"population {config.population_size}, elites {config.num_elites}, "
                      f"{config.num_rl_actors} RL actors, {config.generations} generations "
                      f"of one 200-step episode per actor, "
                      f"{make_cem_rl(config).gradient_steps} gradient steps per generation, "
                      f"CEM init std {config.init_std}, extra noise {config.extra_noise_init}"
                      f" -> {config.extra_noise_end} (x{config.extra_noise_decay}); the "
                      "same TD3 settings otherwise",
        },
        "eval_episodes": EVAL_EPISODES,
        "final_return": {
            "td3": summary(final_td3),
            "cem_rl": summary(final_cem),
            "cem_rl_minus_td3": {"mean": float(difference.mean()), "ci95": [low, high]},
        },
        "curves": {
            "td3": {"steps": td3_steps.tolist(),
                    "mean": [round(float(v), 1) for v in td3_curve.mean(axis=0)]},
            "cem_rl": {"steps": cem_steps.tolist(),
                       "mean": [round(float(v), 1) for v in cem_curve.mean(axis=0)]},
        },
        "seconds": {"td3": round(td3_seconds, 1), "cem_rl": round(cem_seconds, 1)},
        "device": jax.devices()[0].device_kind,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2)
    out.write_text(text + "\n")
    plot_curves(td3_steps, td3_curve, cem_steps, cem_curve).savefig(
        out.with_name(f"{out.stem}_curves.png"), dpi=90)
    plot_cem_rl(history, title=f"CEM-RL on Pendulum-v1, seed {seeds[0]}").savefig(
        out.with_name(f"{out.stem}_history.png"), dpi=90)
    print(text)


if __name__ == "__main__":
    main()
