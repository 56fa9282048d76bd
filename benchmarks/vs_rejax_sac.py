"""metarl's SAC against rejax 0.1.3's SAC end to end: agent-steps per second of a population
on gymnax Pendulum-v1, same settings and devices, in one process, timed interleaved.

Both train ``--population`` agents (vmapped in one jit, split over ``--devices`` CPU
devices: metarl with :mod:`metarl.sharding`, rejax's vmapped ``train`` jitted with its keys
sharded over the same mesh) with the same settings: 4 environments per agent, one gradient
step per environment step, batch 256, replay capacity ``--total-timesteps``, 1000 steps
of random acting first, ``--hidden``-``--hidden`` ReLU actor and twin critics, learning rate
1e-3 for actor, critics and temperature (metarl's Pendulum defaults; rejax has one rate for
all three), gamma 0.99, Polyak rate 0.005 (rejax: ``polyak = 0.995``), initial temperature
1, entropy target ``-|A|``, no gradient clipping. metarl collects 8 steps of its 4
environments and then runs 32 gradient steps; rejax steps its 4 environments once and runs
4 (``num_epochs``): the same ratio.

Timing covers training only: rejax's evaluation callback is replaced by a no-op while
timing. Final returns are measured the same way for both afterwards: ``--eval-episodes``
deterministic episodes (action ``tanh(mean)``, scaled to the bounds) of every agent's final
policy on the same gymnax environment (:func:`inner_loops.off_policy.evaluate_policy`).

rejax 0.1.3 expects gymnax's older five-value ``step``; it gets the gymnax 1.0 environment
through :class:`vs_rejax.FiveValueStep`. Run it with a Python that has rejax (see
``benchmarks/vs_rejax.py`` for the installation):

    PYTHONPATH=. /tmp/rejax-g1/bin/python benchmarks/vs_rejax_sac.py --population 16 \\
        --total-timesteps 20000 --output docs/results/vs_rejax_sac.json

Prints one JSON document (and writes it to ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_ENVS = 4
LEARNING_RATE = 1e-3
LEARNING_STARTS = 1_000
BATCH_SIZE = 256
GAMMA = 0.99
TAU = 0.005


def build_metarl(args, mesh):
    import jax
    import jax.numpy as jnp

    from inner_loops.sac import SACConfig, build
    from metarl import sharding

    config = SACConfig(env_id="Pendulum-v1", num_envs=NUM_ENVS, train_frequency=8,
                       gradient_steps=8 * NUM_ENVS, total_timesteps=args.total_timesteps,
                       buffer_size=args.total_timesteps, batch_size=BATCH_SIZE,
                       learning_starts=LEARNING_STARTS,
                       actor_hidden_sizes=(args.hidden, args.hidden),
                       critic_hidden_sizes=(args.hidden, args.hidden),
                       actor_learning_rate=LEARNING_RATE, critic_learning_rate=LEARNING_RATE,
                       alpha_learning_rate=LEARNING_RATE, gamma=GAMMA, tau=TAU,
                       eval_episodes=args.eval_episodes)
    learner = build(config)

    def train(key):
        return learner.advance(learner.init(key))[0]

    def run(keys):
        return sharding.shard_population(train, (keys,), mesh, chunk_size=args.population,
                                         replicate_output=False)

    def final_returns(states, keys):
        returns = jax.jit(jax.vmap(lambda s, k: learner.evaluate(s, k)["eval_return"]))(
            states, keys)
        return [float(r) for r in jnp.asarray(returns)]

    return jax.jit(run), final_returns, config.steps_per_agent


def build_rejax(args, mesh):
    import gymnax
    import jax
    import jax.numpy as jnp
    from rejax import SAC
    from vs_rejax import FiveValueStep

    from inner_loops.envs import make_vec_env
    from inner_loops.off_policy import evaluate_policy

    env, env_params = gymnax.make("Pendulum-v1")
    algo = SAC.create(
        env=FiveValueStep(env), env_params=env_params, total_timesteps=args.total_timesteps,
        eval_freq=args.total_timesteps, skip_initial_evaluation=True, num_envs=NUM_ENVS,
        num_epochs=NUM_ENVS, buffer_size=args.total_timesteps, fill_buffer=LEARNING_STARTS,
        batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE, gamma=GAMMA, polyak=1.0 - TAU,
        target_update_freq=1, hidden_layer_sizes=(args.hidden, args.hidden),
        agent_kwargs={"activation": "relu"},
    )
    quiet = algo.replace(eval_callback=lambda a, ts, rng: jnp.zeros(()))
    shardings = {}
    if mesh is not None:
        shardings["in_shardings"] = jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(mesh.axis_names))
    run = jax.jit(lambda keys: jax.vmap(quiet.train)(keys)[0], **shardings)
    eval_env = make_vec_env("Pendulum-v1", 1).env
    max_steps = int(env_params.max_steps_in_episode)
    low, high = (float(b) for b in (env.action_space(env_params).low,
                                    env.action_space(env_params).high))

    def final_returns(states, keys):
        def one(actor_params, key):
            def act(obs):
                mean = algo.actor.apply(actor_params, obs, method="_action_dist").loc
                return low + 0.5 * (jnp.tanh(mean) + 1.0) * (high - low)

            return evaluate_policy(eval_env, act, key, args.eval_episodes, max_steps).eval_return

        returns = jax.jit(jax.vmap(one))(states.actor_ts.params, keys)
        return [float(r) for r in jnp.asarray(returns)]

    # rejax steps NUM_ENVS environments per iteration, ceil(total / NUM_ENVS) iterations
    steps_per_agent = -(-args.total_timesteps // NUM_ENVS) * NUM_ENVS
    return run, final_returns, steps_per_agent


def measure(args) -> dict:
    import jax

    from metarl import sharding

    mesh = sharding.population_mesh(args.devices) if args.devices > 1 else None
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.population)
    if mesh is not None:
        keys = jax.device_put(keys, jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(mesh.axis_names)))
    programs, finals, steps, compile_seconds, outputs = {}, {}, {}, {}, {}
    for name, build in (("metarl", build_metarl), ("rejax", build_rejax)):
        run, finals[name], steps[name] = build(args, mesh)
        started = time.perf_counter()
        programs[name] = run.lower(keys).compile()
        compile_seconds[name] = round(time.perf_counter() - started, 2)
        print(json.dumps({"compiled": name, "seconds": compile_seconds[name]}),
              file=sys.stderr, flush=True)
    seconds = {name: [] for name in programs}
    cpu_seconds = {name: [] for name in programs}
    for round_ in range(args.repeats):
        for name, program in programs.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            outputs[name] = jax.block_until_ready(program(keys))
            seconds[name].append(time.perf_counter() - started)
            cpu_seconds[name].append(time.process_time() - cpu_started)
            print(json.dumps({"round": round_, name: round(seconds[name][-1], 2)}),
                  file=sys.stderr, flush=True)
    eval_keys = jax.random.split(jax.random.PRNGKey(args.seed + 1), args.population)
    returns = {name: finals[name](outputs[name], eval_keys) for name in programs}
    best = {name: round(args.population * steps[name] / min(s)) for name, s in seconds.items()}
    median = {name: round(args.population * steps[name] / statistics.median(s))
              for name, s in seconds.items()}
    return {
        "population": args.population, "devices": args.devices,
        "steps_per_agent": steps,
        "run_seconds": {name: [round(t, 2) for t in s] for name, s in seconds.items()},
        "agent_steps_per_second": best,
        "median_agent_steps_per_second": median,
        "metarl_over_rejax": round(best["metarl"] / best["rejax"], 3),
        # the work each needs, less sensitive than the wall clock to other jobs' load
        "cpu_seconds": {name: [round(t, 2) for t in s] for name, s in cpu_seconds.items()},
        "metarl_over_rejax_cpu": round(
            steps["metarl"] * min(cpu_seconds["rejax"])
            / (steps["rejax"] * min(cpu_seconds["metarl"])), 3),
        "median_metarl_over_rejax": round(median["metarl"] / median["rejax"], 3),
        "compile_seconds": compile_seconds,
        "final_eval_return": {
            name: {"median": round(statistics.median(r), 1), "mean": round(statistics.mean(r), 1),
                   "best": round(max(r), 1), "worst": round(min(r), 1),
                   "per_agent": [round(x, 1) for x in r]}
            for name, r in returns.items()},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--devices", type=int, default=None,
                        help="CPU devices to split the population over (default: one per core)")
    parser.add_argument("--total-timesteps", type=int, default=20_000,
                        help="environment steps per agent")
    parser.add_argument("--hidden", type=int, default=64,
                        help="width of the two hidden layers of actor and critics")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    from metarl import sharding

    args.devices = sharding.use_cpu_cores(args.devices)
    import jax
    import rejax

    row = measure(args)
    result = {
        "benchmark": "vs_rejax_sac",
        "algorithm": "sac",
        "env": "Pendulum-v1 (gymnax 1.0)",
        "settings": f"{NUM_ENVS} envs per agent, one gradient step per env step, batch "
                    f"{BATCH_SIZE}, replay {args.total_timesteps}, {LEARNING_STARTS} random "
                    f"steps first, {args.hidden}-{args.hidden} relu, lr {LEARNING_RATE} "
                    f"(actor, critics, temperature), gamma {GAMMA}, tau {TAU}, initial "
                    "alpha 1, target entropy -|A|, no gradient clipping",
        "total_timesteps_per_agent": args.total_timesteps,
        "repeats": args.repeats,
        "note": "training only is timed (rejax's evaluation callback is a no-op while "
                "timing); final_eval_return: deterministic episodes (tanh of the mean "
                "action) of every agent's final policy, the same evaluation for both. "
                "metarl collects 8 steps x 4 envs then takes 32 gradient steps; rejax 1 "
                "step x 4 envs then 4.",
        "jax": jax.__version__, "rejax": getattr(rejax, "__version__", "0.1.3"),
        **row,
    }
    text = json.dumps(result, indent=1)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
