"""What the evolution machinery costs on top of the inner loop, at the same population size.

Times one jitted generation (ask, train candidates x seeds, fitness, tell) against the plain
``jit(vmap(train))`` of the same number of agents with the same objective, interleaving the
two so machine noise hits both alike, and reports the best of several repeats. Target:
the generation costs at most 5% more.

    python benchmarks/evolution_overhead.py --population 8 --seeds 2
    python benchmarks/evolution_overhead.py --experiment experiments/value_distance_cartpole.toml \
        --set es.population_size=256 --set inner.total_timesteps=500000 --repeats 2

With ``--experiment`` the generation is that file's (``--set`` overrides as ``metarl run``
takes them; ``--population``, ``--seeds`` and ``--total-timesteps`` are then not used), and
the plain training has its objective, every agent with its own copy of the search centre,
as the generation's agents each have their own candidate. ``--cpu-devices`` keeps JAX's
default devices (an accelerator's) instead of one CPU device per core.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path

import jax

import metarl
from inner_loops.population import broadcast_to_population
from metarl.config import apply_overrides
from metarl.evolve.config import config_from_dict
from metarl.evolve.generation import Evolution


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", default="value_distance")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--total-timesteps", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--experiment", type=Path, help="an evolution experiment file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of --experiment (repeatable)")
    parser.add_argument("--default-devices", action="store_true",
                        help="keep JAX's default devices (no CPU device per core)")
    args = parser.parse_args()
    if not args.default_devices:
        metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts

    if args.experiment:
        data = apply_overrides(tomllib.loads(args.experiment.read_text()),
                               args.set + ["run.progress=false"])
        config = config_from_dict(data)
    else:
        config = config_from_dict({
            "objective": {"name": args.objective},
            "inner": {"env_id": "CartPole-v1", "total_timesteps": args.total_timesteps},
            "es": {"population_size": args.population},
            "fitness": {"seeds_per_candidate": args.seeds},
            "run": {"progress": False},
        })
    evolution = Evolution(config)
    agents = config.es.population_size * config.fitness.seeds_per_candidate
    state = evolution.init()
    plain = jax.jit(jax.vmap(evolution.learners[0].train))
    keys = jax.random.split(jax.random.PRNGKey(1), agents)
    meta = broadcast_to_population(evolution.mean_meta_params(state), agents)
    hypers = broadcast_to_population(config.inner[0].hyperparams(), agents)

    started = time.perf_counter()
    generation = evolution.step.lower(state).compile()
    generation_compile = time.perf_counter() - started
    started = time.perf_counter()
    inner = plain.lower(keys, meta, hypers).compile()
    inner_compile = time.perf_counter() - started
    jax.block_until_ready(generation(state))
    jax.block_until_ready(inner(keys, meta, hypers))

    generation_times, inner_times = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        state, _ = generation(state)
        jax.block_until_ready(state)
        generation_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        jax.block_until_ready(inner(keys, meta, hypers))
        inner_times.append(time.perf_counter() - started)

    steps = evolution.agent_steps_per_generation
    best_generation, best_inner = min(generation_times), min(inner_times)
    print(json.dumps({
        "benchmark": "evolution_overhead",
        "objective": config.objective.name,
        "experiment": str(args.experiment) if args.experiment else None,
        "overrides": args.set,
        "backend": jax.default_backend(),
        "candidates": config.es.population_size,
        "seeds_per_candidate": config.fitness.seeds_per_candidate,
        "agents": agents,
        "agent_steps": steps,
        "generation_compile_seconds": round(generation_compile, 2),
        "inner_compile_seconds": round(inner_compile, 2),
        "generation_seconds": [round(t, 3) for t in generation_times],
        "inner_loop_seconds": [round(t, 3) for t in inner_times],
        "generation_agent_steps_per_second": round(steps / best_generation),
        "inner_loop_agent_steps_per_second": round(steps / best_inner),
        "overhead_percent": round(100 * (best_generation / best_inner - 1), 2),
    }, indent=1))


if __name__ == "__main__":
    main()
