"""metarl's PPO against PureJaxRL's ``ppo.py``, same settings, same harness, one process each.

Both trainers run as ``jit(vmap(train))`` over the agents' seeds (``split(PRNGKey(seed),
agents)``), compiled ahead (``.lower().compile()``), then run once and timed to the last
result. Every measurement is a process of its own (this script again, with ``--single``),
and the sides alternate (PureJaxRL, metarl, metarl's variants, then the reverse order in the
next round), so that no side always runs on a warmer machine. Nothing is fetched at run
time: PureJaxRL's ``ppo.py`` and its ``wrappers.py`` are read from the folder given with
``--purejaxrl`` (its ``make_train(config)`` is called with PureJaxRL's own config
dictionary; it imports ``distrax`` and ``gymnax``).

Workloads (:data:`WORKLOADS`; PureJaxRL's settings for each environment family, the same on
both sides): ``cartpole_4096`` CartPole-v1, 4,096 agents x 131,072 steps; ``cartpole_512``
512 x 5e5 (PureJaxRL's defaults); ``spaceinvaders_8`` and ``breakout_8`` MinAtar, 8 x 1e7;
``minatar_64`` SpaceInvaders-MinAtar, 64 agents x 1e6. ``--scale`` multiplies every step
budget (whole updates kept); ``--smoke`` uses tiny sizes that finish in seconds on a CPU.

Final return, both sides alike: per agent, the mean over the last 5% of updates (at least
one) of the update's mean training return (the mean over the episodes that ended in that
update; updates where none ended are skipped), then the mean (and standard deviation) over
agents. PureJaxRL's ``ppo.py`` returns every step's ``info`` (``returned_episode``,
``returned_episode_returns``) as its metrics; metarl returns per-update summaries.

metarl's variants (``--variants``) are ``PPOConfig`` fields joined by ``+``, e.g.
``final_values=none+env_resets=in_step``, or ``default`` (the fields' defaults, which
resolve by backend: on a GPU ``env_resets=in_step`` and ``matmul=xla``); ``matmul=cpu``
gives the networks :mod:`inner_loops.linear`'s CPU arrangement of the dense products,
``matmul=xla`` plain ``lax.dot_general``, as flax's ``Dense`` does by default.

    python benchmarks/vs_purejaxrl.py --purejaxrl .cache/purejaxrl --out result.json
    python benchmarks/vs_purejaxrl.py --purejaxrl .cache/purejaxrl --workloads cartpole_512 \\
        --variants default final_values=none --rounds 2
    python benchmarks/vs_purejaxrl.py --purejaxrl .cache/purejaxrl --smoke --out /tmp/s.json

Prints (and with ``--out`` writes) one JSON document: the device and versions, and per
workload every measurement (side, variant, compile and run seconds, agent-steps per second,
final return), each side's best rate, and metarl's ratio over PureJaxRL per variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# PureJaxRL's ppo.py settings: its __main__ for CartPole-v1, its MinAtar configuration
CARTPOLE = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "UPDATE_EPOCHS": 4,
            "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2,
            "ENT_COEF": 0.01, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh",
            "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}
MINATAR = {**CARTPOLE, "LR": 5e-3, "NUM_ENVS": 64, "NUM_MINIBATCHES": 8,
           "ACTIVATION": "relu"}


@dataclasses.dataclass(frozen=True)
class Workload:
    """One row of the head-to-head: PureJaxRL's config (less ``TOTAL_TIMESTEPS``), the agents
    and each agent's steps (full size, and the ``--smoke`` size)."""

    settings: dict
    agents: int
    steps: int
    smoke_agents: int
    smoke_steps: int

    def env(self, name: str) -> dict:
        return {**self.settings, "ENV_NAME": name}


WORKLOADS = {
    "cartpole_4096": Workload(CARTPOLE, 4096, 131_072, 4, 2048),
    "cartpole_512": Workload(CARTPOLE, 512, 500_000, 4, 2048),
    "spaceinvaders_8": Workload({**MINATAR, "ENV_NAME": "SpaceInvaders-MinAtar"}, 8,
                                10_000_000, 2, 8192),
    "breakout_8": Workload({**MINATAR, "ENV_NAME": "Breakout-MinAtar"}, 8, 10_000_000, 2,
                           8192),
    "minatar_64": Workload({**MINATAR, "ENV_NAME": "SpaceInvaders-MinAtar"}, 64, 1_000_000,
                           2, 8192),
}
FINAL_FRACTION = 0.05


def steps_of(workload: Workload, smoke: bool, scale: float) -> tuple[int, int]:
    """``(agents, steps per agent)``: whole updates of ``NUM_ENVS x NUM_STEPS``, at least
    one, after ``scale``."""
    agents, steps = ((workload.smoke_agents, workload.smoke_steps) if smoke
                     else (workload.agents, workload.steps))
    batch = workload.settings["NUM_ENVS"] * workload.settings["NUM_STEPS"]
    return agents, max(1, round(steps * scale / batch)) * batch


def metarl_config(settings: dict, total_timesteps: int, overrides: dict):
    """metarl's ``PPOConfig`` of PureJaxRL's ``settings`` (its 64-64 networks)."""
    from inner_loops import PPOConfig

    return PPOConfig(
        env_id=settings["ENV_NAME"], num_envs=settings["NUM_ENVS"],
        num_steps=settings["NUM_STEPS"], total_timesteps=total_timesteps,
        update_epochs=settings["UPDATE_EPOCHS"], num_minibatches=settings["NUM_MINIBATCHES"],
        hidden_sizes=(64, 64), activation=settings["ACTIVATION"],
        anneal_lr=settings["ANNEAL_LR"], learning_rate=settings["LR"],
        gamma=settings["GAMMA"], gae_lambda=settings["GAE_LAMBDA"],
        clip_eps=settings["CLIP_EPS"], ent_coef=settings["ENT_COEF"],
        vf_coef=settings["VF_COEF"], max_grad_norm=settings["MAX_GRAD_NORM"], **overrides)


def parse_variant(variant: str) -> dict:
    """``"a=1+b=x"`` -> ``{"a": 1, "b": "x"}`` (``"default"``: no change); values that read
    as JSON (numbers, booleans) are converted."""
    if variant == "default":
        return {}
    fields = {}
    for part in variant.split("+"):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variants: {part!r} is not FIELD=VALUE")
        try:
            fields[name] = json.loads(value)
        except json.JSONDecodeError:
            fields[name] = value
    return fields


class FiveValueStep:
    """A gymnax 1.0 environment with gymnax 0.0.x's ``step``, which PureJaxRL's wrappers
    call: ``done`` (terminated or truncated, as gymnax 0.0.x's ``done`` was) in place of
    the two flags; everything else is passed through."""

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


class FiveValueGymnax:
    """What PureJaxRL's ``ppo.py`` reads of ``gymnax``: ``make``, giving environments whose
    ``step`` returns five values when the installed gymnax returns six."""

    def __init__(self, gymnax):
        self.gymnax = gymnax

    def make(self, name, **kwargs):
        env, params = self.gymnax.make(name, **kwargs)
        import jax

        key = jax.random.PRNGKey(0)
        _, state = env.reset(key, params)
        shape = jax.eval_shape(lambda: env.step(key, state, env.action_space(params).sample(
            key), params))
        return (FiveValueStep(env) if len(shape) == 6 else env), params


def load_purejaxrl(folder: Path):
    """PureJaxRL's ``ppo.py`` from ``folder`` as a module (its ``wrappers`` import resolved
    from the same folder), its ``gymnax.make`` adapted by :class:`FiveValueGymnax`."""
    path = Path(folder).resolve() / "ppo.py"
    if not path.is_file():
        raise SystemExit(f"--purejaxrl: no ppo.py in {folder}")
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("purejaxrl_ppo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.gymnax = FiveValueGymnax(module.gymnax)
    return module


def final_return(update_returns):
    """``[agents, updates]`` per-update mean returns (NaN where no episode ended) -> per
    agent the mean over the last :data:`FINAL_FRACTION` of updates, as a list."""
    import numpy as np

    curve = np.asarray(update_returns, np.float64)
    window = max(1, math.ceil(FINAL_FRACTION * curve.shape[-1]))
    tail = curve[:, -window:]
    seen = np.isfinite(tail)
    totals = np.where(seen, tail, 0.0).sum(axis=-1)
    counts = seen.sum(axis=-1)
    return [float(t / c) if c else math.nan for t, c in zip(totals, counts, strict=True)]


def purejaxrl_update_returns(metrics):
    """PureJaxRL's per-step ``info`` ``[agents, updates, steps, envs]`` -> ``[agents,
    updates]`` mean return of the episodes that ended in each update (NaN if none)."""
    import numpy as np

    ended = np.asarray(metrics["returned_episode"], bool)
    returns = np.asarray(metrics["returned_episode_returns"], np.float64)
    axes = tuple(range(2, ended.ndim))
    count = ended.sum(axis=axes)
    total = np.where(ended, returns, 0.0).sum(axis=axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def build(side: str, workload: Workload, total_timesteps: int, variant: str,
          purejaxrl: Path | None):
    """``train(key) -> metrics`` of one side, and how its metrics become per-update
    returns."""
    import numpy as np

    if side == "purejaxrl":
        module = load_purejaxrl(purejaxrl)
        config = {**workload.settings, "TOTAL_TIMESTEPS": total_timesteps}
        train = module.make_train(config)
        return (lambda key: train(key)["metrics"]), purejaxrl_update_returns
    from inner_loops import make_train

    train = make_train(metarl_config(workload.settings, total_timesteps,
                                     parse_variant(variant)))

    def update_returns(metrics):  # metarl carries a return forward through updates
        ended = np.asarray(metrics["episodes"]) > 0  # that ended no episode: skip those
        return np.where(ended, np.asarray(metrics["episode_return"], np.float64), np.nan)

    return train, update_returns


def measure(side: str, name: str, variant: str, smoke: bool, scale: float, seed: int,
            purejaxrl: Path | None) -> dict:
    """One measurement, in this process: compile ahead, run once, time it."""
    import jax
    import numpy as np

    workload = WORKLOADS[name]
    agents, steps = steps_of(workload, smoke, scale)
    train, update_returns = build(side, workload, steps, variant, purejaxrl)
    keys = jax.random.split(jax.random.PRNGKey(seed), agents)
    started = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    metrics = jax.block_until_ready(compiled(keys))
    run_seconds = time.perf_counter() - started
    returns = final_return(update_returns(jax.device_get(metrics)))
    finite = [r for r in returns if math.isfinite(r)]
    return {
        "side": side, "variant": variant if side == "metarl" else None, "workload": name,
        "agents": agents, "steps_per_agent": steps,
        "compile_seconds": round(compile_seconds, 2), "run_seconds": round(run_seconds, 3),
        "agent_steps_per_second": round(agents * steps / run_seconds),
        "final_return_mean": float(np.mean(finite)) if finite else None,
        "final_return_std": float(np.std(finite)) if finite else None,
        "agents_with_a_return": len(finite),
    }


def environment() -> dict:
    """Versions and devices. Called in a child process: the orchestrating process never
    starts JAX, which would hold the accelerator's memory while the measurements run."""
    from importlib.metadata import PackageNotFoundError, version

    import jax

    def installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    devices = jax.devices()
    return {"jax": jax.__version__, "jaxlib": installed("jaxlib"),
            "flax": installed("flax"), "gymnax": installed("gymnax"),
            "distrax": installed("distrax"), "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind, "devices": [str(d) for d in devices]}


def child_environment(env: dict | None = None) -> dict:
    """:func:`environment`, read in a process of its own."""
    command = [sys.executable, str(Path(__file__).resolve()), "--environment"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=env)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_purejaxrl_folder(parser: argparse.ArgumentParser, folder: Path | None) -> None:
    """Refuse, on one line, a missing ``--purejaxrl`` or a folder without PureJaxRL's two
    files (before any measurement starts)."""
    if folder is None:
        parser.error("--purejaxrl FOLDER is required (PureJaxRL's ppo.py and wrappers.py)")
    missing = [name for name in ("ppo.py", "wrappers.py") if not (folder / name).is_file()]
    if missing:
        parser.error(f"--purejaxrl: {folder} has no {' or '.join(missing)}")


def check_variants(parser: argparse.ArgumentParser, variants: list[str]) -> None:
    """Refuse, on one line, a variant that is no valid ``PPOConfig`` (before any
    measurement starts; building a config starts no JAX backend)."""
    for variant in variants:
        try:
            metarl_config(CARTPOLE, CARTPOLE["NUM_ENVS"] * CARTPOLE["NUM_STEPS"],
                          parse_variant(variant))
        except (TypeError, ValueError) as error:
            parser.error(f"--variants: {variant}: {error}")


def order_of_round(sides: list[tuple[str, str]], round_index: int) -> list[tuple[str, str]]:
    """The sides in this round's order: as given in even rounds, reversed in odd ones."""
    return sides if round_index % 2 == 0 else sides[::-1]


def run_single(args: list[str], timeout: float, env: dict | None = None) -> dict:
    """This script with ``--single ARGS`` in a process of its own; its JSON line, or what
    went wrong."""
    command = [sys.executable, str(Path(__file__).resolve()), "--single", *args]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"time limit ({timeout:.0f} s)"}
    if out.returncode != 0:
        return {"error": f"exit {out.returncode}", "stderr": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(rows: list[dict]) -> dict:
    """Per side and variant the best and median rate and the returns; metarl's ratios."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if "error" in row or "skipped" in row:
            continue
        label = "purejaxrl" if row["side"] == "purejaxrl" else f"metarl:{row['variant']}"
        groups.setdefault(label, []).append(row)
    sides = {label: {"best_agent_steps_per_second": max(r["agent_steps_per_second"]
                                                        for r in group),
                     "median_agent_steps_per_second": round(statistics.median(
                         r["agent_steps_per_second"] for r in group)),
                     "final_return_mean": group[0]["final_return_mean"],
                     "final_return_std": group[0]["final_return_std"],
                     "measurements": len(group)}
             for label, group in groups.items()}
    ratios = {}
    if "purejaxrl" in sides:
        base = sides["purejaxrl"]["best_agent_steps_per_second"]
        ratios = {label: round(side["best_agent_steps_per_second"] / base, 3)
                  for label, side in sides.items() if label != "purejaxrl"}
    return {"sides": sides, "metarl_over_purejaxrl": ratios}


def head_to_head(workloads: list[str], variants: list[str], rounds: int, smoke: bool,
                 scale: float, seed: int, purejaxrl: Path, deadline: float,
                 process_limit: float, env: dict | None = None, log=None) -> dict:
    """Every workload's measurements (``rounds`` alternating rounds of PureJaxRL and each
    metarl variant), within ``deadline`` (a ``time.perf_counter()`` value): what would start
    after it is recorded as skipped."""
    report = {}
    sides = [("purejaxrl", "-")] + [("metarl", v) for v in variants]
    for name in workloads:
        rows = []
        for round_index in range(rounds):
            for side, variant in order_of_round(sides, round_index):
                left = deadline - time.perf_counter()
                if left < 5:
                    rows.append({"side": side, "variant": variant, "skipped": "time budget"})
                    continue
                args = [side, name, variant, "--scale", str(scale), "--seed", str(seed),
                        "--purejaxrl", str(purejaxrl)] + (["--smoke"] if smoke else [])
                row = run_single(args, min(process_limit, left), env)
                row.setdefault("side", side)
                row.setdefault("variant", variant if side == "metarl" else None)
                rows.append(row)
                if log:
                    log(json.dumps(row))
        report[name] = {"measurements": rows, **summarise(rows)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--purejaxrl", type=Path,
                        help="the folder holding PureJaxRL's ppo.py and wrappers.py")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS),
                        default=list(WORKLOADS))
    parser.add_argument("--variants", nargs="+", default=["default"],
                        help="metarl variants, FIELD=VALUE[+FIELD=VALUE] or 'default'")
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternating rounds of every side (default 1)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply every step budget (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for a CPU")
    parser.add_argument("--deadline", type=float, default=3600,
                        help="seconds at most for everything (default 3600)")
    parser.add_argument("--process-limit", type=float, default=600,
                        help="seconds at most per measurement (default 600)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--single", nargs=3, metavar=("SIDE", "WORKLOAD", "VARIANT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--environment", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.environment:
        print(json.dumps(environment()))
        return
    if args.single:
        side, name, variant = args.single
        print(json.dumps(measure(side, name, variant, args.smoke, args.scale, args.seed,
                                 args.purejaxrl)))
        return
    check_purejaxrl_folder(parser, args.purejaxrl)
    check_variants(parser, args.variants)
    started = time.perf_counter()
    report = {
        "benchmark": "vs_purejaxrl",
        "command": " ".join(["python", "benchmarks/vs_purejaxrl.py"] + sys.argv[1:]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "smoke": args.smoke, "scale": args.scale,
        "environment": child_environment(),
        "final_return": f"per agent the mean over the last {FINAL_FRACTION:.0%} of updates "
                        "of the update's mean training return; mean and std over agents",
        "workloads": {},
    }
    report["workloads"] = head_to_head(
        args.workloads, args.variants, args.rounds, args.smoke, args.scale, args.seed,
        args.purejaxrl, started + args.deadline, args.process_limit,
        log=lambda line: print(line, file=sys.stderr, flush=True))
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
