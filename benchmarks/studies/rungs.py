"""What stopping candidates early saves: one generation in rungs against the full one.

Times one jitted generation of the value-distance experiment on CartPole-v1 (PPO at
PureJaxRL's 4 x 128 steps per update) in three forms, interleaved so machine noise hits all
alike, best of several repeats:

- ``full``: every candidate trains its whole budget (``es.rungs = 1``);
- ``segments``: the same training in ``--rungs`` rungs of ``eta = 1``, no one stopped: what
  masking the stopped candidates would cost (every lane of the vmap keeps training), plus
  the rungs' own bookkeeping;
- ``halving``: ``--rungs`` rungs of ``--eta``, the survivors' states gathered per rung.

Reports each one's seconds and agent-steps, and the ratios to ``full``.

    python benchmarks/studies/rungs.py --population 9 --rungs 3 --eta 3 --total-timesteps 55296

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax

import metarl
from metarl.evolve.config import config_from_dict
from metarl.evolve.generation import Evolution


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=9)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rungs", type=int, default=3)
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--total-timesteps", type=int, default=27 * 2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    metarl.use_cpu_cores()  # one JAX CPU device per core, before JAX starts

    base = config_from_dict({
        "objective": {"name": "value_distance"},
        "inner": {"env_id": "CartPole-v1", "total_timesteps": args.total_timesteps},
        "es": {"strategy": "SNES", "population_size": args.population},
        "fitness": {"seeds_per_candidate": args.seeds},
        "run": {"progress": False},
    })
    forms = {"full": (1, args.eta), "segments": (args.rungs, 1),
             "halving": (args.rungs, args.eta)}
    programs, states, compile_seconds, steps = {}, {}, {}, {}
    for name, (rungs, eta) in forms.items():
        evolution = Evolution(base.replace(es=dataclasses.replace(base.es, rungs=rungs,
                                                                  eta=eta)))
        states[name] = evolution.init()
        started = time.perf_counter()
        programs[name] = evolution.step.lower(states[name]).compile()
        compile_seconds[name] = time.perf_counter() - started
        steps[name] = evolution.agent_steps_per_generation
        jax.block_until_ready(programs[name](states[name]))  # warm
    seconds = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name in forms:
            started = time.perf_counter()
            jax.block_until_ready(programs[name](states[name]))
            seconds[name].append(time.perf_counter() - started)
    best = {name: min(values) for name, values in seconds.items()}
    print(json.dumps({
        "benchmark": "rungs",
        "command": "python benchmarks/studies/rungs.py " + " ".join(
            f"--{key.replace('_', '-')} {value}" for key, value in vars(args).items()),
        "devices": jax.device_count(),
        "load_average": os.getloadavg(),
        "population": args.population, "seeds": args.seeds, "rungs": args.rungs,
        "eta": args.eta, "total_timesteps": args.total_timesteps,
        "agent_steps": steps,
        "seconds_best": best,
        "seconds_all": seconds,
        "compile_seconds": compile_seconds,
        "time_vs_full": {name: best[name] / best["full"] for name in forms},
        "agent_steps_vs_full": {name: steps[name] / steps["full"] for name in forms},
    }, indent=2))


if __name__ == "__main__":
    main()
