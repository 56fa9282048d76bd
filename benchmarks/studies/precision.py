"""Mixed precision end to end: ``precision = "float32"`` against ``"bfloat16"``, for PPO,
DQN, TD3 or SAC (``--algorithm``).

A population of agents (one seed each) is trained in one ``jit(vmap(...))`` per precision:
both programs are compiled first (compile time reported apart), then run interleaved
(float32, bfloat16, float32, ...) so that load on a shared machine falls on both alike.
Learning is checked on the same runs, seed by seed (every precision trains the same seeds):

- ``ppo``: PureJaxRL's CartPole-v1 settings (4 envs x 128 steps, 5e5 steps per agent,
  4 epochs x 4 minibatches, 64-64 tanh); an agent's return is the mean over the episodes
  of its last update (the learning bar is a mean of at least 450 over 16 seeds).
- ``dqn`` (CartPole-v1, 5e4 steps per agent by default, half its default budget), ``td3``
  and ``sac`` (Pendulum-v1, their default 2e4 steps): the algorithm's default config at
  ``--total-timesteps``; after training, every agent's deterministic policy (greedy or mean
  action) runs ``eval_episodes`` episodes in the same program (so the timed runs include
  it), and its return is their mean.

    python benchmarks/studies/precision.py                         # PPO, 16 agents, 1 device
    python benchmarks/studies/precision.py --population 64 --devices 1 2
    python benchmarks/studies/precision.py --algorithm dqn td3 sac --repeats 2   # 4 agents each

Each algorithm and device count runs in a child process whose JAX exposes that many CPU
devices. There is no untimed warm-up run: every run's seconds are reported, the first
round's included. Prints one JSON document per algorithm (several in a ``runs`` list):
agent-steps per second per precision (best and median of the repeats), bfloat16 over
float32, compile times, final returns per agent, and the CPU's name.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# _per_device.py is in benchmarks/, one folder up
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _per_device import CHILD_FLAG, cpu, run_children  # noqa: E402

PRECISIONS = ("float32", "bfloat16")
# algorithm -> (config class, environment, default agents, default steps per agent)
ALGORITHMS = {
    "ppo": ("PPOConfig", "CartPole-v1", 16, 500_000),
    "dqn": ("DQNConfig", "CartPole-v1", 4, 50_000),
    "td3": ("TD3Config", "Pendulum-v1", 4, 20_000),
    "sac": ("SACConfig", "Pendulum-v1", 4, 20_000),
}


def agent_run(learner):
    """``(key, meta_params, hypers) -> metrics`` of one agent: its training metrics and,
    when the learner has a deterministic evaluation, that evaluation after training."""
    import jax

    if learner.evaluate_fn is None:
        return learner.train

    def run(key, meta_params=None, hypers=None):
        train_key, eval_key = jax.random.split(key)
        state, metrics = learner.advance(learner.init(train_key, meta_params, hypers),
                                         meta_params, hypers)
        return {**metrics, **learner.evaluate(state, eval_key)}

    return run


def final_returns(outputs) -> list[float]:
    """Every agent's final return: deterministic evaluation if there was one, else the
    training episodes of the last update."""
    import numpy as np

    returns = outputs["eval_return"] if "eval_return" in outputs else (
        outputs["episode_return"][:, -1])
    return [round(float(x), 1) for x in np.asarray(returns)]


def measure(algorithm: str, population: int, devices: int, total_timesteps: int,
            repeats: int) -> dict:
    """Runs in a child process whose JAX exposes ``devices`` CPU devices."""
    import jax
    import numpy as np

    import inner_loops
    from inner_loops import make_learner
    from metarl import sharding

    config_class = getattr(inner_loops, ALGORITHMS[algorithm][0])
    mesh = sharding.population_mesh(devices) if devices > 1 else None
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    placed = keys if mesh is None else sharding.put_replicated(keys, mesh)
    programs, compile_seconds, outputs = {}, {}, {}
    for precision in PRECISIONS:
        learner = make_learner(config_class(total_timesteps=total_timesteps,
                                            precision=precision))
        steps_per_agent = learner.steps_per_agent
        agent = agent_run(learner)
        run = jax.jit(lambda k, agent=agent: sharding.train_population(agent, k, mesh=mesh))
        started = time.perf_counter()
        programs[precision] = run.lower(placed).compile()
        compile_seconds[precision] = round(time.perf_counter() - started, 2)
    seconds = {precision: [] for precision in PRECISIONS}
    for _ in range(repeats):
        for precision, program in programs.items():
            started = time.perf_counter()
            outputs[precision] = jax.device_get(program(placed))
            seconds[precision].append(time.perf_counter() - started)
    steps = population * steps_per_agent
    best = {p: round(steps / min(s)) for p, s in seconds.items()}
    median = {p: round(steps / statistics.median(s)) for p, s in seconds.items()}
    final = {p: final_returns(outputs[p]) for p in PRECISIONS}
    return {
        "population": population, "devices": devices,
        "steps_per_agent": steps_per_agent,
        "run_seconds": {p: [round(x, 2) for x in s] for p, s in seconds.items()},
        "agent_steps_per_second": best,
        "median_agent_steps_per_second": median,
        "bfloat16_over_float32": round(best["bfloat16"] / best["float32"], 3),
        "median_bfloat16_over_float32": round(median["bfloat16"] / median["float32"], 3),
        "compile_seconds": compile_seconds,
        "all_metrics_finite": {p: bool(np.all(outputs[p]["finite"])) if "finite" in outputs[p]
                               else None for p in PRECISIONS},
        "final_return_mean": {p: round(float(np.mean(r)), 1) for p, r in final.items()},
        "final_return_median": {p: round(float(np.median(r)), 1) for p, r in final.items()},
        "final_return_per_agent": final,
    }


def report(algorithm: str, population: int | None, devices: list[int],
           total_timesteps: int | None, repeats: int) -> dict:
    """The JSON document of ``algorithm``: a child process per device count."""
    import jax

    config_name, env_id, default_population, default_total = ALGORITHMS[algorithm]
    population = population or default_population
    total_timesteps = total_timesteps or default_total
    results = run_children(__file__, devices,
                           [algorithm, population, total_timesteps, repeats])
    return {
        "benchmark": "precision",
        "algorithm": algorithm,
        "settings": (f"{env_id}, PureJaxRL's settings, 64-64 tanh" if algorithm == "ppo"
                     else f"{env_id}, the default {config_name} at total_timesteps = "
                          f"{total_timesteps}, deterministic evaluation after training"),
        "total_timesteps_per_agent": total_timesteps,
        "repeats": repeats,
        **cpu(),
        "jax": jax.__version__,
        "results": results,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        # as run_children passes them: the first argument, the device count, the rest
        algorithm, (devices, population, total, repeats) = sys.argv[2], map(int, sys.argv[3:7])
        print(json.dumps(measure(algorithm, population, devices, total, repeats)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", nargs="+", choices=tuple(ALGORITHMS), default=["ppo"])
    parser.add_argument("--population", type=int, help="agents (default: 16 for ppo, 4 "
                        "for the off-policy learners)")
    parser.add_argument("--devices", type=int, nargs="+", default=[1])
    parser.add_argument("--total-timesteps", type=int,
                        help="environment steps per agent (default: ppo 5e5, PureJaxRL's; "
                             "dqn 5e4; td3 and sac 2e4)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reports = [report(algorithm, args.population, args.devices, args.total_timesteps,
                      args.repeats) for algorithm in args.algorithm]
    print(json.dumps(reports[0] if len(reports) == 1 else {"runs": reports}, indent=1))


if __name__ == "__main__":
    main()
