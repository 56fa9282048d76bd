"""DvD-TD3 on Pendulum-v1: is the population more diverse with the diversity term than the
same population without it, and what does that do to its return?

Arms, each trained on the same held-out seeds with the same budget (environment steps per
member) and the same TD3 settings (networks 64-64, the rest TD3Config's Pendulum defaults):

- ``none``: weight 0 throughout (a population of TD3 actors sharing a critic and buffer);
- ``bandit``: the paper's Thompson sampling over the weights {0, 0.5};
- ``constant``: weight ``--weight`` throughout.

Measured at the end of training, per seed: the population's diversity -- the log-det of the
RBF kernel over the members' actions on a fixed set of 256 Pendulum states drawn by a
uniformly random policy (the same states for every arm and seed; near 0 when the members
act differently, very negative when they act alike) -- and each member's deterministic
return over 20 evaluation episodes (the population's best and mean member). Every figure
comes with its mean over seeds and a 95% bootstrap interval; the difference to ``none`` is
paired by seed.

    python experiments/dvd_pendulum.py                       # 4 seeds, 8000 steps/member
    python experiments/dvd_pendulum.py --seeds 2 --steps 3200 --out /tmp/dvd.json   # quick

Prints one JSON document and writes it to ``--out`` (default
``docs/results/dvd_pendulum.json``), with a figure of the history of the first seed of
each arm beside it (``.png``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import metarl
from inner_loops.td3 import TD3Config
from metarl.figures.population import plot_dvd
from metarl.population.dvd import DvDConfig, make_dvd, segment_record
from metarl.stats import aggregate

FIRST_SEED = 1000  # held out: development used seeds 0-9
EVAL_EPISODES = 20
PROBE_STATES = 256


def probe_states(env, key: jax.Array, count: int) -> jax.Array:
    """``count`` states of ``count`` uniformly random episodes after a random number of
    steps (0..199): the fixed states every population's diversity is measured on."""
    spec = env.spec
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    reset_key, step_key, length_key = jax.random.split(key, 3)
    obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, count))
    lengths = jax.random.randint(length_key, (count,), 0, 200)
    keys = jax.random.split(step_key, (200, count))

    def step(carry, inputs):
        obs, state, kept = carry
        t, step_keys = inputs
        kept = jnp.where((t == lengths)[:, None], obs, kept)
        actions = jax.vmap(lambda k: jax.random.uniform(k, (spec.action_dim,), minval=low,
                                                        maxval=high))(step_keys)
        result = jax.vmap(env.step)(step_keys, state, actions)
        return (result.obs, result.state, kept), None

    (_, _, kept), _ = jax.lax.scan(step, (obs, state, obs), (jnp.arange(200), keys))
    return kept


def summary(values, baseline=None) -> dict:
    values = np.asarray(values, np.float64)
    mean = aggregate(values, "mean")
    out = {"mean": float(values.mean()), "ci95": [mean.low, mean.high],
           "per_seed": [round(float(v), 3) for v in values]}
    if baseline is not None:
        difference = values - np.asarray(baseline, np.float64)
        mean = aggregate(difference, "mean")
        out["minus_none"] = {"mean": float(difference.mean()), "ci95": [mean.low, mean.high]}
    return out


def run_arm(config: DvDConfig, seeds: list[int], states: jax.Array) -> dict:
    run = make_dvd(config)
    keys = jnp.stack([jax.random.PRNGKey(seed) for seed in seeds])
    started = time.perf_counter()
    population = jax.jit(jax.vmap(run.init))(keys)
    segment = jax.jit(jax.vmap(run.segment, in_axes=(0, None)))
    histories = [[] for _ in seeds]
    for _ in range(config.num_segments):
        population, metrics = segment(population, run.hyperparams())
        for index in range(len(seeds)):
            histories[index].append(segment_record(jax.tree.map(lambda m, i=index: m[i],
                                                                metrics)))
    diversity = jax.jit(jax.vmap(run.diversity, in_axes=(0, None)))(
        population.actors.params, states)
    evaluate = jax.jit(jax.vmap(lambda s, k: run.evaluate(s, k, EVAL_EPISODES)))
    returns = np.asarray(evaluate(population, jax.random.split(jax.random.PRNGKey(7),
                                                               len(seeds))))  # [S, M]
    return {
        "diversity": np.asarray(diversity),
        "best_return": returns.max(axis=1),
        "mean_return": returns.mean(axis=1),
        "member_returns": returns,
        "skipped_actor_steps": int(sum(r["skipped_actor_steps"] for h in histories
                                       for r in h)),
        "finite": all(r["finite"] for h in histories for r in h),
        "weights": [r["weight"] for r in histories[0]],
        "history": histories[0],
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8_000,
                        help="environment steps per member (a multiple of 32 x segment)")
    parser.add_argument("--population", type=int, default=5)
    parser.add_argument("--segment-updates", type=int, default=25)
    parser.add_argument("--weight", type=float, default=0.5)
    parser.add_argument("--arms", default="none,bandit,constant")
    parser.add_argument("--out", default="docs/results/dvd_pendulum.json")
    args = parser.parse_args()
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts

    inner = TD3Config(env_id="Pendulum-v1", actor_hidden_sizes=(64, 64),
                      critic_hidden_sizes=(64, 64), total_timesteps=args.steps,
                      buffer_size=args.steps * args.population)
    base = DvDConfig(inner=inner, population_size=args.population,
                     segment_updates=args.segment_updates)
    configs = {
        "none": base.replace(weight_schedule="constant", weight=0.0),
        "bandit": base.replace(weight_schedule="bandit", bandit_weights=(0.0, 0.5)),
        "constant": base.replace(weight_schedule="constant", weight=args.weight),
    }
    seeds = list(range(FIRST_SEED, FIRST_SEED + args.seeds))
    run = make_dvd(base)
    states = probe_states(run.parts.vec_env.env, jax.random.PRNGKey(3), PROBE_STATES)
    results = {name: run_arm(configs[name], seeds, states) for name in args.arms.split(",")}
    none = results.get("none")
    report = {
        "env": "Pendulum-v1",
        "population": args.population,
        "steps_per_member": inner.steps_per_agent,
        "seeds": seeds,
        "settings": "TD3Config defaults for Pendulum-v1 with 64-64 networks; shared buffer of "
                    f"{inner.buffer_size}; embedding states {base.embedding_states}, length "
                    f"scale {base.length_scale}, jitter {base.jitter}, max_grad_norm "
                    f"{base.max_grad_norm}; segments of {base.segment_updates} updates",
        "diversity_states": f"{PROBE_STATES} states of uniformly random episodes",
        "eval_episodes": EVAL_EPISODES,
        "arms": {},
        "device": jax.devices()[0].device_kind,
    }
    for name, result in results.items():
        entry = {
            "diversity": summary(result["diversity"], none and none["diversity"]),
            "best_return": summary(result["best_return"], none and none["best_return"]),
            "mean_return": summary(result["mean_return"], none and none["mean_return"]),
            "skipped_actor_steps": result["skipped_actor_steps"],
            "finite": result["finite"],
            "weight_per_segment_first_seed": result["weights"],
            "seconds": round(result["seconds"], 1),
        }
        if name == "none":
            for key in ("diversity", "best_return", "mean_return"):
                entry[key].pop("minus_none", None)
        report["arms"][name] = entry
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2)
    out.write_text(text + "\n")
    for name, result in results.items():
        plot_dvd(result["history"], title=f"DvD on Pendulum-v1, {name}, seed {seeds[0]}"
                 ).savefig(out.with_name(f"{out.stem}_{name}.png"), dpi=90)
    print(text)


if __name__ == "__main__":
    main()
