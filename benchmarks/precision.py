"""Mixed precision end to end: PPO with ``precision = "float32"`` against ``"bfloat16"``.

PureJaxRL's CartPole-v1 settings (4 envs x 128 steps, 5e5 steps per agent, 4 epochs x 4
minibatches, 64-64 tanh) for a population of agents in one ``jit(vmap(train))``, both
precisions compiled first, then timed interleaved (float32, bfloat16, float32, ...) so
that load on a shared machine falls on both alike. Learning is checked on the same runs:
every agent's mean return over the episodes of its last update, per precision (the
learning bar is a mean of at least 450 over 16 seeds).

    python benchmarks/precision.py                         # 16 agents, 1 device
    python benchmarks/precision.py --population 64 --devices 1 2

Each device count runs in a child process whose JAX exposes that many CPU devices.
Prints one JSON document: agent-steps per second per precision (best and median of the
repeats), bfloat16 over float32, compile times, final returns, and the CPU's name.
"""

from __future__ import annotations

import json
import statistics
import time

from _per_device import cpu, population_benchmark

PRECISIONS = ("float32", "bfloat16")


def measure(population: int, devices: int, total_timesteps: int, repeats: int) -> dict:
    """Runs in a child process whose JAX exposes ``devices`` CPU devices."""
    import jax
    import numpy as np

    from inner_loops import PPOConfig, make_learner
    from metarl import sharding

    mesh = sharding.population_mesh(devices) if devices > 1 else None
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    placed = keys if mesh is None else sharding.put_replicated(keys, mesh)
    programs, compile_seconds, outputs = {}, {}, {}
    for precision in PRECISIONS:
        learner = make_learner(PPOConfig(total_timesteps=total_timesteps, precision=precision))
        run = jax.jit(lambda k, learner=learner: sharding.train_population(
            learner.train, k, mesh=mesh))
        started = time.perf_counter()
        programs[precision] = run.lower(placed).compile()
        compile_seconds[precision] = round(time.perf_counter() - started, 2)
        outputs[precision] = jax.block_until_ready(programs[precision](placed))  # warm-up
    seconds = {precision: [] for precision in PRECISIONS}
    for _ in range(repeats):
        for precision, program in programs.items():
            started = time.perf_counter()
            outputs[precision] = jax.block_until_ready(program(placed))
            seconds[precision].append(time.perf_counter() - started)
    steps = population * total_timesteps
    best = {p: round(steps / min(s)) for p, s in seconds.items()}
    median = {p: round(steps / statistics.median(s)) for p, s in seconds.items()}
    final = {p: np.asarray(outputs[p]["episode_return"][:, -1]) for p in PRECISIONS}
    return {
        "population": population, "devices": devices,
        "agent_steps_per_second": best,
        "median_agent_steps_per_second": median,
        "bfloat16_over_float32": round(best["bfloat16"] / best["float32"], 3),
        "median_bfloat16_over_float32": round(median["bfloat16"] / median["float32"], 3),
        "compile_seconds": compile_seconds,
        "final_return_mean": {p: round(float(r.mean()), 1) for p, r in final.items()},
        "final_return_median": {p: round(float(np.median(r)), 1) for p, r in final.items()},
        "final_return_per_agent": {p: [round(float(x), 1) for x in r] for p, r in final.items()},
    }


def main() -> None:
    parsed = population_benchmark(__file__, __doc__.splitlines()[0], measure, 16, [1])
    if parsed is None:
        return
    args, results = parsed
    import jax

    print(json.dumps({
        "benchmark": "precision",
        "algorithm": "ppo",
        "settings": "CartPole-v1, PureJaxRL's settings, 64-64 tanh",
        "total_timesteps_per_agent": args.total_timesteps,
        "repeats": args.repeats,
        **cpu(),
        "jax": jax.__version__,
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
