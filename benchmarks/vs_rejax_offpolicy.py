"""metarl's off-policy learners (DQN, TD3, SAC) against rejax 0.1.3's, end to end: agent-steps
per second of a population on a gymnax environment, same settings and devices, timed
interleaved in one process per device count.

Both libraries train ``--population`` agents (vmapped in one jit; with more than one device
split over them: metarl with :mod:`metarl.sharding`, rejax's vmapped ``train`` jitted with its
keys sharded over the same mesh). Each device count in ``--devices`` runs in a child process
whose JAX exposes that many CPU devices. Timing covers training only: rejax's evaluation
callback is replaced by a no-op. Afterwards every agent's final policy of both libraries is
evaluated the same way: ``--eval-episodes`` deterministic episodes on the same gymnax
environment with the same keys (:func:`inner_loops.off_policy.evaluate_policy`; greedy
action for DQN, the actor's action for TD3, ``tanh`` of the mean for SAC).

rejax 0.1.3's replay buffer samples each batch with ``jax.random.choice(..., replace=False,
p=...)`` over its whole capacity, which costs work in proportion to the capacity at every
gradient step. ``--rejax-sampler uniform`` replaces it (in rejax, for this run) by uniform
draws with replacement from the filled part, as metarl samples, to measure how much of
rejax's time that is; the default, ``choice``, runs rejax as published.

rejax 0.1.3 expects gymnax's older five-value ``step``; it gets the gymnax 1.0 environment
through :class:`vs_rejax.FiveValueStep` (``done`` = terminated or truncated, so rejax does
not bootstrap through a time limit; metarl does). rejax fixes DQN's and TD3's hidden layers
at 64-64, so ``--hidden`` must be 64 for them. Settings per algorithm (metarl's defaults for
the environment, rejax set to match; what cannot be matched is said):

- ``dqn``, CartPole-v1: 8 environments per agent, half a gradient step per environment step
  (metarl: 32 steps of 8 environments, then 128 gradient steps; rejax: one step of 8, then
  4), batch 64, replay ``min(1e5, budget)``, 1000 random steps first, 64-64 ReLU Q-network,
  L2 TD loss, double DQN, hard target copy every 128 gradient steps (rejax: every 256
  environment steps with ``polyak = 0``), epsilon 1 to 0.04 over the first 16 % of the
  budget, Adam at 5e-4 decaying linearly to 0 (metarl: per update, counted from the first
  update; rejax: an optax schedule per gradient step, counted from the first), gamma 0.99,
  gradients clipped at 10 (metarl: global norm; rejax: each element, ``optax.clip``).
- ``td3``, Pendulum-v1: 4 environments, one gradient step per environment step (metarl: 8
  steps of 4, then 32 critic steps in blocks of 2, one actor step and one Polyak update per
  block; rejax: twice one step of 4 and 4 critic steps, then 4 actor steps on the last 4
  batches and one target update), batch 128, replay the budget, 1000 random steps first,
  64-64 ReLU actor and twin critics, Adam at 1e-3 for both, gamma 0.98, policy delay 2,
  exploration noise 0.1, target noise 0.2 clipped at 0.5 (metarl's in the unit action box,
  rejax's in Pendulum's units: 0.2, 0.4 and 1.0), Polyak rate 0.005 per actor step (rejax
  moves its targets once per 4 actor steps, by ``1 - 0.995^4``), no gradient clipping.
- ``sac``, Pendulum-v1: 4 environments, one gradient step per environment step (metarl: 8
  steps of 4, then 32; rejax: one step of 4, then 4), batch 256, replay the budget, 1000
  random steps first, ``--hidden`` ReLU actor and twin critics, Adam at 1e-3 for actor,
  critics and temperature (rejax has one rate for all three), gamma 0.99, Polyak rate 0.005
  (rejax: ``polyak = 0.995``), initial temperature 1, entropy target ``-|A|``, no gradient
  clipping. The same settings as ``docs/results/vs_rejax_sac.json``.

Run it with a Python that has rejax (see ``benchmarks/vs_rejax.py`` for the installation):

    PYTHONPATH=. /tmp/rejax-g1/bin/python benchmarks/vs_rejax_offpolicy.py --algorithm dqn \\
        --population 16 --devices 1 2 --total-timesteps 50000 \\
        --output docs/results/vs_rejax_dqn.json

Prints one JSON document (and writes it to ``--output``): per device count, agent-steps per
second of both (best and median of the interleaved repeats), their ratio, process CPU
seconds, compile seconds apart and the final deterministic returns, with the load average
before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LEARNING_STARTS = 1_000
REJAX_FIXED_HIDDEN = 64  # rejax 0.1.3's DQN and TD3 build 64-64 networks whatever is asked


class Comparison(NamedTuple):
    """One algorithm's matched settings: the environment, metarl's config fields, rejax's
    ``create`` arguments, rejax's deterministic policy and the summary for the report."""

    env_id: str
    num_envs: int
    rejax_class: str
    settings: str
    unmatched: str
    hidden_is_free: bool = False

    def metarl_config(self, name: str, args):
        from inner_loops.dqn import DQNConfig
        from inner_loops.sac import SACConfig
        from inner_loops.td3 import TD3Config

        common = dict(env_id=self.env_id, num_envs=self.num_envs,
                      total_timesteps=args.total_timesteps, learning_starts=LEARNING_STARTS,
                      eval_episodes=args.eval_episodes)
        hidden = (args.hidden, args.hidden)
        if name == "dqn":
            return DQNConfig(**common, train_frequency=32, gradient_steps=128,
                             buffer_size=min(100_000, args.total_timesteps), batch_size=64,
                             target_update_interval=128, double_dqn=True, anneal_lr=True,
                             td_loss="l2", hidden_sizes=hidden, activation="relu",
                             learning_rate=5e-4, gamma=0.99, tau=1.0, epsilon_start=1.0,
                             epsilon_end=0.04, exploration_fraction=0.16, max_grad_norm=10.0)
        continuous = dict(common, train_frequency=8, gradient_steps=8 * self.num_envs,
                          buffer_size=args.total_timesteps, actor_hidden_sizes=hidden,
                          critic_hidden_sizes=hidden, activation="relu",
                          actor_learning_rate=1e-3, critic_learning_rate=1e-3, tau=0.005)
        if name == "td3":
            return TD3Config(**continuous, batch_size=128, gamma=0.98, policy_delay=2,
                             exploration_noise=0.1, target_noise=0.2, noise_clip=0.5)
        return SACConfig(**continuous, batch_size=256, gamma=0.99, alpha_learning_rate=1e-3)

    def rejax_arguments(self, name: str, args, action_half_range: float) -> dict:
        import optax

        if name == "dqn":
            iterations = -(-args.total_timesteps // self.num_envs)
            learning_iterations = iterations - (LEARNING_STARTS // self.num_envs + 1)
            return dict(num_epochs=4, buffer_size=min(100_000, args.total_timesteps),
                        batch_size=64, ddqn=True, target_update_freq=256, polyak=0.0,
                        eps_start=1.0, eps_end=0.04, exploration_fraction=0.16,
                        learning_rate=optax.linear_schedule(5e-4, 0.0, 4 * learning_iterations),
                        gamma=0.99, max_grad_norm=10.0, agent_kwargs={"activation": "relu"})
        if name == "td3":
            return dict(num_epochs=self.num_envs, policy_delay=2,
                        buffer_size=args.total_timesteps, batch_size=128, learning_rate=1e-3,
                        gamma=0.98, polyak=0.995 ** self.num_envs, target_update_freq=1,
                        exploration_noise=0.1 * action_half_range,
                        target_noise=0.2 * action_half_range,
                        target_noise_clip=0.5 * action_half_range,
                        actor_kwargs={"activation": "relu"},
                        critic_kwargs={"activation": "relu"})
        return dict(num_epochs=self.num_envs, buffer_size=args.total_timesteps, batch_size=256,
                    learning_rate=1e-3, gamma=0.99, polyak=0.995, target_update_freq=1,
                    hidden_layer_sizes=(args.hidden, args.hidden),
                    agent_kwargs={"activation": "relu"})

    def rejax_steps_per_agent(self, name: str, total_timesteps: int) -> int:
        """rejax runs whole iterations: ``num_envs`` steps each (TD3: ``policy_delay`` x)."""
        per_iteration = self.num_envs * (2 if name == "td3" else 1)
        return -(-total_timesteps // per_iteration) * per_iteration


COMPARISONS = {
    "dqn": Comparison(
        env_id="CartPole-v1", num_envs=8, rejax_class="DQN",
        settings="8 envs per agent, 0.5 gradient steps per env step (metarl 32 steps x 8 "
                 "envs then 128; rejax 1 x 8 then 4), batch 64, replay min(1e5, budget), 1000 "
                 "random steps first, 64-64 relu, L2 TD loss, double DQN, hard target copy "
                 "every 128 gradient steps (rejax every 256 env steps, polyak 0), epsilon "
                 "1 -> 0.04 over 16 % of the budget, Adam 5e-4 decaying linearly to 0, gamma "
                 "0.99, gradient clip 10",
        unmatched="gradient clip: metarl by global norm, rejax elementwise (optax.clip); "
                  "learning-rate decay: metarl per update of 128 gradient steps counted from "
                  "the first update (warm-up included), rejax per gradient step from the "
                  "first; epsilon: metarl per update of 256 steps, rejax per 8 steps; rejax "
                  "treats time-limit truncation as termination (five-value step adapter)"),
    "td3": Comparison(
        env_id="Pendulum-v1", num_envs=4, rejax_class="TD3",
        settings="4 envs per agent, one critic step per env step, batch 128, replay the "
                 "budget, 1000 random steps first, 64-64 relu actor and twin critics, Adam "
                 "1e-3 (actor, critics), gamma 0.98, policy delay 2, exploration noise 0.1, "
                 "target noise 0.2 clipped at 0.5 (unit action box; rejax 0.2 / 0.4 / 1.0 "
                 "in Pendulum's units), tau 0.005 per actor step, no gradient clipping",
        unmatched="order of work: metarl collects 8 steps x 4 envs then 16 blocks of 2 "
                  "critic steps, 1 actor step and 1 Polyak update (tau 0.005); rejax per "
                  "iteration collects 4 envs twice with 4 critic steps after each, then 4 "
                  "actor steps on the last 4 batches and one target update with polyak "
                  "0.995^4 (the same movement per 4 actor steps); rejax treats Pendulum's "
                  "time limit as termination (five-value step adapter)"),
    "sac": Comparison(
        env_id="Pendulum-v1", num_envs=4, rejax_class="SAC", hidden_is_free=True,
        settings="4 envs per agent, one gradient step per env step, batch 256, replay the "
                 "budget, 1000 random steps first, {hidden}-{hidden} relu, lr 0.001 (actor, "
                 "critics, temperature), gamma 0.99, tau 0.005, initial alpha 1, target "
                 "entropy -|A|, no gradient clipping",
        unmatched="metarl collects 8 steps x 4 envs then takes 32 gradient steps; rejax 1 "
                  "step x 4 envs then 4; rejax has one learning rate for actor, critics and "
                  "temperature (all 1e-3 here); rejax treats Pendulum's time limit as "
                  "termination (five-value step adapter)"),
}


def metarl_overrides(pairs: list[str]) -> dict:
    """``["max_grad_norm=1e6", ...]`` as config fields (values read as Python literals)."""
    import ast

    fields = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--metarl-set: expected FIELD=VALUE, got {pair!r}")
        fields[name.strip()] = ast.literal_eval(value.strip())
    return fields


def build_metarl(args, mesh):
    import jax
    import jax.numpy as jnp

    from inner_loops import make_learner
    from metarl import sharding

    config = COMPARISONS[args.algorithm].metarl_config(args.algorithm, args)
    config = config.replace(**metarl_overrides(args.metarl_set))
    learner = make_learner(config)

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


def rejax_policy(name: str, algo, states):
    """``(parameters per agent, act(parameters, obs) -> deterministic action)``."""
    import jax.numpy as jnp

    if name == "dqn":
        return states.q_ts.params, lambda p, obs: jnp.argmax(algo.agent.apply(p, obs), axis=-1)
    if name == "td3":
        return states.actor_ts.params, algo.actor.apply
    space = algo.env.action_space(algo.env_params)
    low, high = float(space.low), float(space.high)

    def act(params, obs):
        mean = algo.actor.apply(params, obs, method="_action_dist").loc
        return low + 0.5 * (jnp.tanh(mean) + 1.0) * (high - low)

    return states.actor_ts.params, act


def use_uniform_sampling(rejax) -> None:
    """Make rejax's replay buffer draw batches uniformly with replacement from its filled
    part (``randint``, as metarl does) instead of ``choice`` without replacement over the
    whole capacity."""
    import jax
    import jax.numpy as jnp

    def sample(buffer, num, rng):
        index = jax.random.randint(rng, (num,), 0, jnp.maximum(buffer.num_entries, 1))
        return jax.tree.map(lambda arr: arr[index], buffer.data)

    rejax.buffers.ReplayBuffer.sample = sample


def build_rejax(args, mesh):
    import gymnax
    import jax
    import jax.numpy as jnp
    import rejax
    from vs_rejax import FiveValueStep

    from inner_loops.envs import make_vec_env
    from inner_loops.off_policy import evaluate_policy

    if args.rejax_sampler == "uniform":
        use_uniform_sampling(rejax)
    comparison = COMPARISONS[args.algorithm]
    env, env_params = gymnax.make(comparison.env_id)
    space = env.action_space(env_params)
    half_range = float((space.high - space.low) / 2) if hasattr(space, "high") else 1.0
    algo = getattr(rejax, comparison.rejax_class).create(
        env=FiveValueStep(env), env_params=env_params, total_timesteps=args.total_timesteps,
        eval_freq=args.total_timesteps, skip_initial_evaluation=True,
        num_envs=comparison.num_envs, fill_buffer=LEARNING_STARTS,
        **comparison.rejax_arguments(args.algorithm, args, half_range))
    quiet = algo.replace(eval_callback=lambda a, ts, rng: jnp.zeros(()))
    shardings = {}
    if mesh is not None:
        shardings["in_shardings"] = jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(mesh.axis_names))
    run = jax.jit(lambda keys: jax.vmap(quiet.train)(keys)[0], **shardings)
    eval_env = make_vec_env(comparison.env_id, 1).env
    max_steps = int(env_params.max_steps_in_episode)

    def final_returns(states, keys):
        params, act = rejax_policy(args.algorithm, algo, states)

        def one(agent_params, key):
            return evaluate_policy(eval_env, lambda obs: act(agent_params, obs), key,
                                   args.eval_episodes, max_steps).eval_return

        returns = jax.jit(jax.vmap(one))(params, keys)
        return [float(r) for r in jnp.asarray(returns)]

    return run, final_returns, comparison.rejax_steps_per_agent(args.algorithm,
                                                                 args.total_timesteps)


def measure(args, devices: int) -> dict:
    import jax

    from metarl import sharding

    load_before = [round(x, 2) for x in os.getloadavg()]
    mesh = sharding.population_mesh(devices) if devices > 1 else None
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
        print(json.dumps({"devices": devices, "compiled": name,
                          "seconds": compile_seconds[name]}), file=sys.stderr, flush=True)
    seconds = {name: [] for name in programs}
    cpu_seconds = {name: [] for name in programs}
    for round_ in range(args.repeats):
        for name, program in programs.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            outputs[name] = jax.block_until_ready(program(keys))
            seconds[name].append(time.perf_counter() - started)
            cpu_seconds[name].append(time.process_time() - cpu_started)
            print(json.dumps({"devices": devices, "round": round_,
                              name: round(seconds[name][-1], 2)}), file=sys.stderr, flush=True)
    eval_keys = jax.random.split(jax.random.PRNGKey(args.seed + 1), args.population)
    returns = {name: finals[name](outputs[name], eval_keys) for name in programs}
    best = {name: round(args.population * steps[name] / min(s)) for name, s in seconds.items()}
    median = {name: round(args.population * steps[name] / statistics.median(s))
              for name, s in seconds.items()}
    return {
        "population": args.population, "devices": devices,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "steps_per_agent": steps,
        "run_seconds": {name: [round(t, 2) for t in s] for name, s in seconds.items()},
        "agent_steps_per_second": best,
        "median_agent_steps_per_second": median,
        "metarl_over_rejax": round(best["metarl"] / best["rejax"], 3),
        "median_metarl_over_rejax": round(median["metarl"] / median["rejax"], 3),
        # the work each needs, less sensitive than the wall clock to other jobs' load
        "cpu_seconds": {name: [round(t, 2) for t in s] for name, s in cpu_seconds.items()},
        "metarl_over_rejax_cpu": round(
            steps["metarl"] * min(cpu_seconds["rejax"])
            / (steps["rejax"] * min(cpu_seconds["metarl"])), 3),
        "compile_seconds": compile_seconds,
        "final_eval_return": {
            name: {"median": round(statistics.median(r), 1), "mean": round(statistics.mean(r), 1),
                   "best": round(max(r), 1), "worst": round(min(r), 1),
                   "per_agent": [round(x, 1) for x in r]}
            for name, r in returns.items()},
    }


def run_child(argv: list[str], devices: int) -> dict:
    """This script on one device count in a child process whose JAX exposes that many CPU
    devices; its progress goes to this process's stderr, its one JSON line is returned."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_NUM_CPU_DEVICES"] = str(devices)
    command = [sys.executable, os.path.abspath(__file__), *argv, "--child", str(devices)]
    child = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=sorted(COMPARISONS), required=True)
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2],
                        help="CPU device counts to split the population over, one child each")
    parser.add_argument("--total-timesteps", type=int, default=20_000,
                        help="environment steps per agent")
    parser.add_argument("--hidden", type=int, default=REJAX_FIXED_HIDDEN,
                        help="width of the two hidden layers (SAC only; DQN and TD3: 64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rejax-sampler", choices=("choice", "uniform"), default="choice",
                        help="rejax's replay sampling: as published (choice without "
                             "replacement over the capacity) or uniform with replacement")
    parser.add_argument("--metarl-set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a field of metarl's config from the matched settings "
                             "(e.g. max_grad_norm=1e6), to find what a difference comes from")
    parser.add_argument("--output", default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    comparison = COMPARISONS[args.algorithm]
    if args.hidden != REJAX_FIXED_HIDDEN and not comparison.hidden_is_free:
        parser.error(f"--hidden: rejax 0.1.3's {args.algorithm} has 64-64 hidden layers")
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if args.child is not None:
        from metarl import sharding

        sharding.use_cpu_cores(args.child)
        print(json.dumps(measure(args, args.child)))
        return
    passed = ["--algorithm", args.algorithm, "--population", args.population,
              "--total-timesteps", args.total_timesteps, "--hidden", args.hidden,
              "--repeats", args.repeats, "--eval-episodes", args.eval_episodes,
              "--seed", args.seed, "--rejax-sampler", args.rejax_sampler]
    for pair in args.metarl_set:
        passed += ["--metarl-set", pair]
    results = []
    for count in args.devices:
        results.append(run_child([str(a) for a in passed], count))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    import jax
    import rejax

    comparison = COMPARISONS[args.algorithm]
    text = json.dumps({
        "benchmark": "vs_rejax_offpolicy",
        "algorithm": args.algorithm,
        "command": "PYTHONPATH=. <python with rejax> benchmarks/vs_rejax_offpolicy.py "
                   + shlex.join(argv),
        "env": f"{comparison.env_id} (gymnax 1.0)",
        "settings": comparison.settings.format(hidden=args.hidden),
        "not_matched": comparison.unmatched,
        "rejax_sampler": args.rejax_sampler,
        "metarl_changed": metarl_overrides(args.metarl_set),
        "total_timesteps_per_agent": args.total_timesteps,
        "repeats": args.repeats,
        "note": "training only is timed (rejax's evaluation callback is a no-op while "
                "timing), interleaved metarl/rejax in each round; final_eval_return: "
                f"{args.eval_episodes} deterministic episodes of every agent's final policy, "
                "the same evaluation function and keys for both",
        "jax": jax.__version__, "rejax": getattr(rejax, "__version__", "0.1.3"),
        "results": results,
    }, indent=1)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
