"""metarl against the public pure-JAX library rejax, on the same settings and devices, in
one process, timed interleaved.

PPO on CartPole-v1 with PureJaxRL's settings (4 envs x 128 steps, 4 epochs x 4 minibatches,
64-64 tanh, learning rate 2.5e-4, clip 0.2, entropy 0.01, value 0.5, gradient clip 0.5) for
a population of agents vmapped in one jit. With ``--devices 2`` both populations are split
over two CPU devices: metarl with its own sharding (``metarl.sharding``), rejax's vmapped
``train`` jitted with its keys sharded over the same mesh, so XLA partitions it the same
way. Evaluation is excluded from rejax's timing (its callback is replaced by a no-op).
Afterwards every agent's final policy of both libraries is evaluated by one function:
``EVAL_EPISODES`` greedy episodes (the most likely action) of CartPole-v1 from the same
start states (:func:`inner_loops.off_policy.evaluate_policy`).

rejax 0.1.3 expects gymnax's older five-value ``step``; it gets the same gymnax 1.0
environment through a small adapter (termination or truncation as ``done``). Install rejax
beside metarl, in a virtual environment that sees this one's packages, without letting pip
replace gymnax 1.0 by the older one rejax asks for:

    python3 -m venv --system-site-packages .venv-rejax
    .venv-rejax/bin/pip install --no-deps rejax==0.1.3 distrax==0.1.9 chex tfp-nightly \
        dm-tree toolz gast
    .venv-rejax/bin/python benchmarks/vs_rejax.py --population 64 --devices 1 2

Prints one JSON document: agent-steps per second of both (best and median of the repeats),
their ratio, compile times and the median and mean over agents of the final greedy return.
"""

from __future__ import annotations

import json
import statistics
import time

from _per_device import population_benchmark

EVAL_EPISODES = 32
SETTINGS = dict(num_envs=4, num_steps=128, update_epochs=4, num_minibatches=4,
                learning_rate=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
                ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5)


class FiveValueStep:
    """A gymnax 1.0 environment as gymnax 0.x's API: ``step`` returns ``done`` (terminated
    or truncated) in place of the two flags; everything else is passed through."""

    def __init__(self, env):
        self.env = env

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action,
                                                                         params)
        return obs, state, reward, terminated | truncated, info

    def __getattr__(self, name):
        if name == "env":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def __hash__(self):  # rejax passes the environment as a static jit argument
        return hash(self.env)

    def __eq__(self, other):
        return isinstance(other, FiveValueStep) and other.env is self.env


def build_metarl(total_timesteps: int, mesh):
    import jax

    from inner_loops import PPOConfig, make_learner, networks
    from metarl import sharding

    config = PPOConfig(env_id="CartPole-v1", total_timesteps=total_timesteps,
                       hidden_sizes=(64, 64), activation="tanh", anneal_lr=False, **SETTINGS)
    learner = make_learner(config)
    # the learner's own network, rebuilt to act greedily in the evaluation
    network = networks.ActorCritic(action_dim=learner.spec.action_dim, discrete=True,
                                   obs_ndim=len(learner.spec.obs_shape),
                                   hidden_sizes=config.hidden_sizes,
                                   activation=config.activation)

    def train(key):
        return learner.advance(learner.init(key))[0].params

    def run(keys):
        # metarl's default chunking (16 agents at a time per CPU device)
        return sharding.shard_population(train, (keys,), mesh, replicate_output=False)

    def greedy(params, obs):
        return jax.numpy.argmax(network.apply(params, obs)[0], axis=-1)

    return jax.jit(run), greedy, lambda params: params


def build_rejax(total_timesteps: int, mesh):
    import gymnax
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    from rejax import PPO

    env, env_params = gymnax.make("CartPole-v1")
    algo = PPO.create(
        env=FiveValueStep(env), env_params=env_params, total_timesteps=total_timesteps,
        eval_freq=total_timesteps, skip_initial_evaluation=True,
        num_envs=SETTINGS["num_envs"], num_steps=SETTINGS["num_steps"],
        num_epochs=SETTINGS["update_epochs"], num_minibatches=SETTINGS["num_minibatches"],
        learning_rate=SETTINGS["learning_rate"], gamma=SETTINGS["gamma"],
        gae_lambda=SETTINGS["gae_lambda"], clip_eps=SETTINGS["clip_eps"],
        ent_coef=SETTINGS["ent_coef"], vf_coef=SETTINGS["vf_coef"],
        max_grad_norm=SETTINGS["max_grad_norm"],
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)},
    )
    quiet = algo.replace(eval_callback=lambda a, ts, rng: jnp.zeros(()))
    shardings = {}
    if mesh is not None:
        shardings["in_shardings"] = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    run = jax.jit(lambda keys: jax.vmap(quiet.train)(keys)[0], **shardings)

    def greedy(params, obs):
        return jnp.argmax(algo.actor.apply(params, obs, method="_action_dist").logits, axis=-1)

    return run, greedy, lambda states: states.actor_ts.params


def final_returns(greedy, params, episodes: int) -> list[float]:
    """Every agent's mean return over ``episodes`` greedy episodes of CartPole-v1, the same
    start states for both libraries (:func:`inner_loops.off_policy.evaluate_policy`)."""
    import jax

    from inner_loops.envs import make_vec_env
    from inner_loops.off_policy import evaluate_policy

    vec_env = make_vec_env("CartPole-v1", 1)
    env, max_steps = vec_env.env, vec_env.spec.max_episode_steps
    population = jax.tree.leaves(params)[0].shape[0]
    keys = jax.random.split(jax.random.PRNGKey(1), population)

    def one(agent_params, key):
        return evaluate_policy(env, lambda obs: greedy(agent_params, obs), key, episodes,
                               max_steps).eval_return

    return [float(r) for r in jax.jit(jax.vmap(one))(params, keys)]


def measure(population: int, devices: int, total_timesteps: int, repeats: int) -> dict:
    """Runs in a child process whose JAX exposes ``devices`` CPU devices."""
    import jax

    from metarl import sharding

    mesh = sharding.population_mesh(devices) if devices > 1 else None
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    if mesh is not None:  # both take their keys split over the mesh
        keys = jax.device_put(keys, jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(mesh.axis_names)))
    programs, policies, compile_seconds, outputs = {}, {}, {}, {}
    for name, build in (("metarl", build_metarl), ("rejax", build_rejax)):
        run, greedy, parameters_of = build(total_timesteps, mesh)
        started = time.perf_counter()
        programs[name] = run.lower(keys).compile()
        compile_seconds[name] = round(time.perf_counter() - started, 2)
        policies[name] = greedy, parameters_of
        outputs[name] = jax.block_until_ready(programs[name](keys))  # warm-up
    seconds = {name: [] for name in programs}
    for _ in range(repeats):
        for name, program in programs.items():
            started = time.perf_counter()
            outputs[name] = jax.block_until_ready(program(keys))
            seconds[name].append(time.perf_counter() - started)
    steps = population * total_timesteps
    returns = {name: final_returns(greedy, parameters_of(outputs[name]), EVAL_EPISODES)
               for name, (greedy, parameters_of) in policies.items()}
    returns_summary = {name: {"median": round(statistics.median(r), 1),
                              "mean": round(statistics.mean(r), 1)}
                       for name, r in returns.items()}
    best = {name: round(steps / min(s)) for name, s in seconds.items()}
    median = {name: round(steps / statistics.median(s)) for name, s in seconds.items()}
    return {
        "population": population, "devices": devices,
        "agent_steps_per_second": best,
        "median_agent_steps_per_second": median,
        "metarl_over_rejax": round(best["metarl"] / best["rejax"], 3),
        "median_metarl_over_rejax": round(median["metarl"] / median["rejax"], 3),
        "compile_seconds": compile_seconds,
        "final_return": returns_summary,
    }


def main() -> None:
    parsed = population_benchmark(__file__, __doc__.splitlines()[0], measure, 64, [1, 2])
    if parsed is None:
        return
    args, results = parsed
    import jax
    import rejax

    print(json.dumps({
        "benchmark": "vs_rejax",
        "algorithm": "ppo",
        "settings": "CartPole-v1, PureJaxRL: " + ", ".join(f"{k} {v}" for k, v in
                                                          SETTINGS.items())
                    + ", 64-64 tanh, no learning-rate annealing",
        "total_timesteps_per_agent": args.total_timesteps,
        "repeats": args.repeats,
        "note": "final_return: median and mean over agents of each agent's mean return in "
                f"{EVAL_EPISODES} greedy episodes, both libraries evaluated by one function "
                "from the same start states. rejax clips "
                "gradients elementwise (optax.clip) and has separate actor and critic "
                "optimisers; metarl clips the global norm with one optimiser.",
        "jax": jax.__version__, "rejax": getattr(rejax, "__version__", "0.1.3"),
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
