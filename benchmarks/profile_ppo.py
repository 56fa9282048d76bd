"""Where PPO's time goes: the share of each phase in a population's ``jit(vmap(train))``.

The compiled program runs under JAX's profiler with XLA's per-operation trace events on
(``--xla_cpu_enable_xprof_traceme``). Every event is an operation of the compiled program;
its phase comes from the named scope it was traced under in :mod:`inner_loops.ppo`:

- ``rollout``: environment steps and the policy's forward pass while acting;
- ``gae``: the values of the reached observations and the advantage scan;
- ``shuffle``: flattening the rollout and gathering it into shuffled minibatches;
- ``forward`` / ``backward``: the loss and its gradient (``transpose`` in JAX's name of an
  operation marks the backward pass);
- ``optimiser``: gradient clipping, Adam and the parameter update;
- ``other``: everything else (the update's bookkeeping, loop control, copies).

Time is exclusive (an event's own time, without the events nested in it) and summed over
the profiled runs. Tracing every operation slows the program down (the JSON gives the run
time with and without the profiler); the shares are of the operations' own time. XLA
fuses neighbouring operations, and a fusion is counted in the phase of the operation it
was named after, so shares at phase borders are approximate.

    python benchmarks/profile_ppo.py                       # 64 agents, PureJaxRL CartPole
    python benchmarks/profile_ppo.py --population 16 --precision bfloat16
    python benchmarks/profile_ppo.py --top 15              # ... and the 15 costliest ops

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

PHASES = ("rollout", "gae", "shuffle", "forward", "backward", "optimiser", "other")
TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name=\"([^\"]*)\"")


def phase_of(op_name: str) -> str:
    """The phase of an operation from its JAX name (its named scopes and transforms)."""
    for scope in ("rollout", "gae", "shuffle", "optimiser"):
        if f"/{scope}/" in op_name or op_name.endswith(f"/{scope}"):
            return scope
    if "/loss/" in op_name or op_name.endswith("/loss"):
        return "backward" if "transpose(" in op_name else "forward"
    return "other"


def op_names(hlo_text: str) -> dict[str, str]:
    """Instruction name -> JAX op name, from a compiled module's text."""
    names = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            names[match.group(1)] = match.group(2)
    return names


def exclusive_times(events) -> dict[str, float]:
    """Own time per event name (ns) on one thread: nested events' time subtracted."""
    own = collections.Counter()
    stack: list[list] = []  # [name, end, nested_ns, duration]
    for start, duration, name in sorted(events, key=lambda e: (e[0], -e[1])):
        while stack and start >= stack[-1][1]:
            finished = stack.pop()
            own[finished[0]] += finished[3] - finished[2]
        if stack:
            stack[-1][2] += duration
        stack.append([name, start + duration, 0.0, duration])
    for finished in stack:
        own[finished[0]] += finished[3] - finished[2]
    return own


def profile(population: int, total_timesteps: int, precision: str, runs: int,
            top: int) -> dict:
    import jax

    from inner_loops import PPOConfig, make_learner

    config = PPOConfig(total_timesteps=total_timesteps, precision=precision)
    learner = make_learner(config)
    keys = jax.random.split(jax.random.PRNGKey(0), population)
    started = time.perf_counter()
    compiled = jax.jit(jax.vmap(learner.train)).lower(keys).compile()
    compile_seconds = time.perf_counter() - started
    jax.block_until_ready(compiled(keys))  # warm-up
    started = time.perf_counter()
    for _ in range(runs):
        jax.block_until_ready(compiled(keys))
    plain_seconds = (time.perf_counter() - started) / runs
    names = op_names(compiled.as_text())
    trace_dir = tempfile.mkdtemp(prefix="metarl-profile-")
    started = time.perf_counter()
    with jax.profiler.trace(trace_dir):
        for _ in range(runs):
            jax.block_until_ready(compiled(keys))
    wall_seconds = (time.perf_counter() - started) / runs
    trace = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    data = jax.profiler.ProfileData.from_file(trace[0])
    shutil.rmtree(trace_dir, ignore_errors=True)
    per_op = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):
                continue  # Python and runtime threads: not the program's operations
            events = [(e.start_ns, e.duration_ns, e.name) for e in line.events
                      if e.name in names]
            per_op.update(exclusive_times(events))
    per_phase = collections.Counter()
    for name, ns in per_op.items():
        per_phase[phase_of(names[name])] += ns
    total = sum(per_phase.values())
    costliest = [
        {"op": name, "phase": phase_of(names[name]), "share": round(ns / total, 4),
         "jax_name": names[name][-120:]}
        for name, ns in per_op.most_common(top)
    ]
    steps = population * config.steps_per_agent
    return {
        "population": population,
        "precision": precision,
        "updates": config.num_updates,
        "compile_seconds": round(compile_seconds, 2),
        "seconds_per_run": round(plain_seconds, 3),
        "agent_steps_per_second": round(steps / plain_seconds),
        "seconds_per_run_profiled": round(wall_seconds, 3),
        "operation_seconds_per_run_profiled": round(total / 1e9 / runs, 3),
        "share": {phase: round(per_phase[phase] / total, 4) for phase in PHASES},
        "costliest_operations": costliest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=64)
    parser.add_argument("--total-timesteps", type=int, default=32_768,
                        help="steps per agent; the cost per update does not depend on it "
                             "(default: 64 of PureJaxRL's updates)")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--runs", type=int, default=2, help="profiled runs")
    parser.add_argument("--top", type=int, default=10, help="costliest operations to list")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        # the trace flag must be set before JAX starts: profile in a child process
        env = dict(os.environ, JAX_NUM_CPU_DEVICES="1",
                   XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {TRACE_FLAG}".strip())
        sys.exit(subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child"],
                                env=env).returncode)
    result = profile(args.population, args.total_timesteps, args.precision, args.runs,
                     args.top)
    print(json.dumps({"benchmark": "profile_ppo",
                      "settings": "CartPole-v1, PureJaxRL's settings, 64-64 tanh, 1 device",
                      **result}, indent=1))


if __name__ == "__main__":
    main()
