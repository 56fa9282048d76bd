"""Time per update step of a whole TD3 or SAC population, fastpbrl's protocol: replay data
preloaded, no environment, batch 256.

What is timed is the real update of :mod:`inner_loops.td3` / :mod:`inner_loops.sac`: the
``learn`` function each algorithm hands to
:func:`inner_loops.continuous_control.build_learner` (captured when the learner is built;
it is not exposed on the :class:`~inner_loops.learner.Learner`). One call runs
``--steps`` gradient steps, each drawing a batch of 256 from a replay buffer already full
of random transitions, then a critic step (both critics) and an actor step (SAC: every
step, with its temperature step; TD3: one actor step per ``policy_delay = 2`` critic
steps, as in fastpbrl) and the Polyak updates. Time per population update step = time of
one call / ``--steps``.

Modes, for each network size (``--sizes``, default fastpbrl's 256-256 and 64-64) and
population (``--populations``, default 1 4 16 64):

- ``loop``: a Python loop over the agents of one jitted single-agent ``learn`` (compiled
  once), waiting for each agent before the next;
- ``vmap``: one ``jit(vmap(learn))`` over the stacked population, on one CPU device;
- ``sharded``: the vmapped population split over one CPU device per core
  (:func:`metarl.sharding.shard_population`, ``shard_map`` over a 1-D mesh, every device
  vmapping its whole share), inputs already placed on their devices.

Compile times are reported apart. For every population the modes run interleaved,
``--repeats`` rounds, so load from other work on a shared machine hits all alike; best and
median are reported, by wall clock and by the process's CPU time.

    python benchmarks/studies/offpolicy_update.py                        # td3 and sac, 1 4 16 64
    python benchmarks/studies/offpolicy_update.py --algorithms sac --populations 16 --sizes 64
    python benchmarks/studies/offpolicy_update.py --output docs/results/offpolicy_update.json \\
        --plot docs/results/offpolicy_update.png

Prints one JSON document (and writes it to ``--output`` when given).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from unittest import mock

MODES = ("loop", "vmap", "sharded")
BATCH_SIZE = 256


def ints(text: str) -> list[int]:
    return [int(part) for part in text.replace(",", " ").split() if part.strip()]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="td3,sac", help="comma-separated: td3, sac")
    parser.add_argument("--populations", type=ints, default=[1, 4, 16, 64])
    parser.add_argument("--sizes", type=ints, default=[256, 64],
                        help="hidden width of the two-layer actor and critics")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=4,
                        help="gradient steps per timed call (a scan)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--devices", type=int, default=None,
                        help="CPU devices of the sharded mode (default: one per core)")
    parser.add_argument("--env", default="Pendulum-v1",
                        help="sets the observation and action sizes only")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a PNG here")
    args = parser.parse_args(argv)
    args.algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(args.algorithms) - {"td3", "sac"} or not args.algorithms:
        parser.error("--algorithms: td3 and/or sac")
    if set(args.modes) - set(MODES) or not args.modes:
        parser.error(f"--modes: a subset of {', '.join(MODES)}")
    if args.steps < 1 or args.repeats < 1 or min(args.populations) < 1 or min(args.sizes) < 1:
        parser.error("--steps, --repeats, --populations and --sizes must be positive")
    if "td3" in args.algorithms and args.steps % 2:
        parser.error("--steps: TD3's policy delay 2 must divide it")
    return args


def capture_update(algorithm: str, width: int, env_id: str, buffer_size: int):
    """``(learner, learn)``: the learner of ``algorithm`` with ``width``-``width`` networks
    and its ``learn(nets, buffer, meta_params, hypers, progress, key)``, captured from the
    :class:`~inner_loops.continuous_control.Algorithm` its ``build`` hands to
    ``build_learner``."""
    from inner_loops import continuous_control, sac, td3

    module = {"td3": td3, "sac": sac}[algorithm]
    config_class = {"td3": td3.TD3Config, "sac": sac.SACConfig}[algorithm]
    # fastpbrl's learning rates (3e-4) and tau; one env, so the buffer is all that matters
    config = config_class(env_id=env_id, num_envs=1, train_frequency=1,
                          gradient_steps=STEPS, batch_size=BATCH_SIZE,
                          buffer_size=buffer_size, learning_starts=BATCH_SIZE,
                          actor_hidden_sizes=(width, width), critic_hidden_sizes=(width, width),
                          actor_learning_rate=3e-4, critic_learning_rate=3e-4, tau=0.005)
    captured = {}

    def build_learner(config, objective, vec_env, eval_max_steps, parts):
        captured["algorithm"] = parts
        return continuous_control.build_learner(config, objective, vec_env, eval_max_steps,
                                                parts)

    with mock.patch.object(module, "build_learner", build_learner):
        learner = module.build(config)
    return learner, captured["algorithm"].learn


STEPS = 4  # set from --steps before any learner is built


def full_buffer(learner, key, capacity: int):
    """One agent's replay buffer filled with ``capacity`` random transitions."""
    import jax
    import jax.numpy as jnp

    from inner_loops import replay
    from inner_loops.off_policy import example_transition

    example = example_transition(learner.spec)
    keys = jax.random.split(key, len(example))
    storage = type(example)(*(
        (jax.random.uniform(k, (capacity, *x.shape)) < 0.01 if x.dtype == jnp.bool_
         else jax.random.normal(k, (capacity, *x.shape), x.dtype))
        for k, x in zip(keys, example, strict=True)))
    return replay.ReplayBuffer(storage, jnp.zeros((), jnp.int32),
                               jnp.full((), capacity, jnp.int32))


def population_inputs(learner, population: int, capacity: int):
    """``(nets, buffer, meta_params, hypers, progress, keys)`` of ``population`` agents,
    every leaf with a leading agent axis."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), population)

    def one(key):
        init_key, buffer_key, learn_key = jax.random.split(key, 3)
        nets = learner.init(init_key).nets
        return nets, full_buffer(learner, buffer_key, capacity), learn_key

    nets, buffer, learn_keys = jax.jit(jax.vmap(one))(keys)
    stack = jax.tree.map(lambda x: jnp.broadcast_to(x, (population, *jnp.shape(x))),
                         (learner.default_meta_params, learner.default_hypers))
    progress = jnp.full((population,), 0.5, jnp.float32)
    return nets, buffer, stack[0], stack[1], progress, learn_keys


def timed(run, *args):
    started, cpu_started = time.perf_counter(), time.process_time()
    run(*args)
    return time.perf_counter() - started, time.process_time() - cpu_started


def build_modes(learn, inputs, population: int, modes, mesh, single):
    """``{mode: (compile_seconds, run)}``; ``run()`` updates the whole population once
    (``STEPS`` gradient steps) and waits for the result."""
    import jax

    from metarl import sharding

    built = {}
    if "loop" in modes:
        compile_seconds, one_agent = single
        agents = [jax.tree.map(lambda x, i=i: x[i], inputs) for i in range(population)]

        def loop():
            for agent in agents:
                jax.block_until_ready(one_agent(*agent))

        built["loop"] = (compile_seconds, loop)
    if "vmap" in modes:
        started = time.perf_counter()
        vmapped = jax.jit(jax.vmap(learn)).lower(*inputs).compile()
        built["vmap"] = (time.perf_counter() - started,
                         lambda: jax.block_until_ready(vmapped(*inputs)))
    if "sharded" in modes:
        size = sharding.num_shards(mesh)
        if population % size == 0:
            split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
                mesh.axis_names))
            placed = jax.device_put(inputs, split)
        else:  # shard_population pins an uneven population whole, then pads it
            placed = sharding.put_replicated(inputs, mesh)
        started = time.perf_counter()
        split_program = jax.jit(lambda *a: sharding.shard_population(
            learn, a, mesh, chunk_size=population, replicate_output=False))
        split_program = split_program.lower(*placed).compile()
        built["sharded"] = (time.perf_counter() - started,
                            lambda: jax.block_until_ready(split_program(*placed)))
    return built


def measure(algorithm: str, width: int, args, mesh) -> list[dict]:
    import jax

    capacity = 10_000
    learner, learn = capture_update(algorithm, width, args.env, capacity)
    single = None
    if "loop" in args.modes:
        one = population_inputs(learner, 1, capacity)
        one = jax.tree.map(lambda x: x[0], one)
        started = time.perf_counter()
        program = jax.jit(learn).lower(*one).compile()
        single = (time.perf_counter() - started, program)
    rows = []
    for population in args.populations:
        inputs = population_inputs(learner, population, capacity)
        built = build_modes(learn, inputs, population, args.modes, mesh, single)
        for _, run in built.values():
            run()  # warm-up
        wall = {mode: [] for mode in built}
        cpu = {mode: [] for mode in built}
        for _ in range(args.repeats):
            for mode, (_, run) in built.items():
                seconds, cpu_seconds = timed(run)
                wall[mode].append(seconds / args.steps)
                cpu[mode].append(cpu_seconds / args.steps)
        row = {"algorithm": algorithm, "hidden": [width, width], "population": population}
        for mode in built:
            row[mode] = {
                "compile_seconds": round(built[mode][0], 2),
                "ms_per_update_best": round(1e3 * min(wall[mode]), 3),
                "ms_per_update_median": round(1e3 * statistics.median(wall[mode]), 3),
                "cpu_ms_per_update_best": round(1e3 * min(cpu[mode]), 3),
                "ms_per_update": [round(1e3 * t, 3) for t in wall[mode]],
            }
        if "loop" in built:
            row["speedup_over_loop"] = {
                mode: {kind: round(row["loop"][f"ms_per_update_{kind}"]
                                   / row[mode][f"ms_per_update_{kind}"], 2)
                       for kind in ("best", "median")}
                for mode in built if mode != "loop"}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "hidden"}), file=sys.stderr,
              flush=True)
    return rows


def plot(rows: list[dict], modes, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algorithms = sorted({row["algorithm"] for row in rows}, reverse=True)
    widths = sorted({row["hidden"][0] for row in rows}, reverse=True)
    figure, axes = plt.subplots(1, len(algorithms), figsize=(5.5 * len(algorithms), 4.2),
                                squeeze=False)
    styles = {"loop": "o-", "vmap": "s-", "sharded": "^-"}
    for axis, algorithm in zip(axes[0], algorithms, strict=True):
        for width, dash in zip(widths, ("-", "--", ":"), strict=False):
            chosen = [r for r in rows if r["algorithm"] == algorithm and r["hidden"][0] == width]
            for mode in modes:
                axis.plot([r["population"] for r in chosen],
                          [r[mode]["ms_per_update_best"] for r in chosen],
                          styles[mode][0] + dash, label=f"{mode}, {width}-{width}")
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("population (agents)")
        axis.set_ylabel("ms per population update step (best)")
        axis.set_title(f"{algorithm.upper()}, batch {BATCH_SIZE}, data preloaded")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"Python loop vs jit(vmap) vs sharded over devices, {os.cpu_count()} "
                    "CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None) -> None:
    global STEPS
    args = parse_args(argv)
    STEPS = args.steps
    from metarl import sharding

    devices = sharding.use_cpu_cores(args.devices)  # before JAX's first computation

    mesh = sharding.population_mesh(devices) if "sharded" in args.modes else None
    rows = []
    for algorithm in args.algorithms:
        for width in args.sizes:
            rows.extend(measure(algorithm, width, args, mesh))
            if args.output:  # what is measured so far, in case the run is cut short
                write(args.output, report(rows, args, devices, complete=False))
    result = report(rows, args, devices, complete=True)
    if args.plot:
        plot(rows, args.modes, args.plot)
        result["plot"] = args.plot
    text = json.dumps(result, indent=1)
    if args.output:
        write(args.output, result)
    print(text)


def write(path: str, result: dict) -> None:
    with open(path, "w") as handle:
        handle.write(json.dumps(result, indent=1) + "\n")


def report(rows, args, devices, complete: bool) -> dict:
    import jax
    from _per_device import cpu


    result = {
        "benchmark": "offpolicy_update",
        "protocol": "fastpbrl: time per update step of the whole population, batch "
                    f"{BATCH_SIZE} drawn from a preloaded replay buffer (10k random "
                    "transitions per agent), no environment; one step = critic step + actor "
                    "step (+ temperature, SAC) + Polyak; TD3 one actor step per 2 critic "
                    "steps",
        "timed": "the learn function inner_loops.td3 / inner_loops.sac give build_learner "
                 "(captured at build), --steps gradient steps per call",
        "env": args.env, "steps_per_call": args.steps, "repeats": args.repeats,
        "modes": args.modes, "sharded_devices": devices,
        "note": "best and median over interleaved rounds; ms per update step of the whole "
                "population (wall clock); compile seconds apart. The loop and vmap modes run "
                "on one CPU device, sharded on one per core. No LayerNorm (fastpbrl has it).",
        "jax_version": jax.__version__, "cpus": os.cpu_count(), **cpu(),
        "results": rows,
    }
    targets = {}
    for row in rows:
        if row["population"] == 16 and "speedup_over_loop" in row:
            for mode, ratio in row["speedup_over_loop"].items():
                targets[f"{row['algorithm']}_{row['hidden'][0]}_{mode}_over_loop_at_16"] = ratio
    if targets:
        result["target"] = {"wanted": 2.0, "ratios": targets,
                            "met_best": all(r["best"] >= 2 for r in targets.values()),
                            "met_median": all(r["median"] >= 2 for r in targets.values())}
    if not complete:
        result["partial"] = True
    return result


if __name__ == "__main__":
    # _per_device.py is in benchmarks/, one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
