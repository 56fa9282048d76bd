"""What a learned optimiser costs against Adam: a whole PPO train, and the update alone.

Usage: ``nice -n 19 python benchmarks/studies/learned_optimizer_cost.py [--total-timesteps N]
[--repeats R]``. In one process, for Adam and each learned optimiser (at initialisation, so
every run does the same learning): compile, then time ``jit(train)`` ``R`` times, and time
the optimiser update alone on PPO's parameter pytree (``jit`` of a ``lax.scan`` of 1000
updates). Prints one JSON object with the best of ``R`` times and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import optax

from inner_loops import ppo
from metarl.objectives import make_objective

NAMES = (None, "learned_optimizer", "open_optimizer")
UPDATE_STEPS = 1000


def best_time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def update_only(objective, params, repeats: int) -> float:
    """Best seconds for ``UPDATE_STEPS`` updates of the rule (Adam for ``None``)."""
    if objective is None:
        rule = optax.with_extra_args_support(optax.scale_by_adam(eps=1e-5))
        meta_params = {}
    else:
        meta_params = objective.init(jax.random.PRNGKey(0))

    @jax.jit
    def run(meta_params):
        tx = rule if objective is None else objective.optimizer_transformation(meta_params)

        def step(state, n):
            grads = jax.tree.map(lambda p: jnp.sin(p * n), params)
            key = jax.random.fold_in(jax.random.PRNGKey(0), n.astype(jnp.int32))
            updates, state = tx.update(grads, state, params, progress=n / UPDATE_STEPS,
                                       key=key)
            # every leaf reaches the output, so XLA cannot drop any of the work
            return state, sum(u.sum() for u in jax.tree.leaves(updates))

        return jax.lax.scan(step, tx.init(params), jnp.arange(float(UPDATE_STEPS)))[1]

    return best_time(lambda: run(meta_params), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--total-timesteps", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = ppo.PPOConfig(total_timesteps=args.total_timesteps)  # PureJaxRL CartPole
    results = []
    for name in NAMES:
        objective = None if name is None else make_objective(name)
        learner = ppo.build(config, objective)
        train = jax.jit(learner.train)
        seconds = best_time(lambda learner=learner, train=train: train(
            jax.random.PRNGKey(0), learner.default_meta_params, learner.default_hypers),
            args.repeats)
        params = learner.init(jax.random.PRNGKey(0)).params
        results.append({
            "optimizer": name or "adam",
            "train_seconds": seconds,
            "update_seconds_per_1000": update_only(objective, params, args.repeats),
            "num_parameters": sum(x.size for x in jax.tree.leaves(params)),
        })
    optimizer_steps = config.num_updates * config.update_epochs * config.num_minibatches
    print(json.dumps({"config": {"total_timesteps": config.total_timesteps,
                                 "optimizer_steps": optimizer_steps,
                                 "hidden_sizes": list(config.hidden_sizes)},
                      "repeats": args.repeats, "load_average": os.getloadavg(),
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
