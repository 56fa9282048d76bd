"""The GPU-sized experiment files on an accelerator: compile time, seconds per step, agent-steps
per second, and the projected time of each whole file.

The GPU files (``experiments/*_gpu.toml``, ``lpo_minatar``, ``lpo_brax``) run for hours to days,
so each runs here as a *slice*: the file itself through ``python -m metarl run`` in a
subprocess, with its population, networks, environments and batch shapes, but fewer updates
per generation or segment (``--set`` overrides, listed per file in :data:`SLICES`), stopped
after ``--steps`` lines of ``metrics.jsonl`` or at its time limit. A step's cost is linear in
its updates (the updates are one ``lax.scan``), so the last line's agent-steps per second,
times the full file's agent-steps, projects the whole file; the first line's excess over a
later one is the compilation. Off-policy slices also start learning after fewer environment
steps (``learning_starts``) so that their few segments measure the learning phase.

Also measured: PPO's throughput by population size with PureJaxRL's CartPole settings
(``benchmarks/throughput.py``), and the quick start's main job end to end.

    python benchmarks/gpu_experiments.py --out docs/results/gpu_experiments.json
    python benchmarks/gpu_experiments.py --smoke --out /tmp/smoke.json    # tiny, any CPU

The orchestrating process never imports JAX (each part is a subprocess with its own time
limit, so one failure or overrun leaves the others' results); ``--deadline`` bounds the whole.
Prints and writes one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"

# name -> (experiment file, overrides that make the slice). Per-inner budgets are set by
# index so that each keeps its share of the whole (Breakout trains 5e5 steps, the rest 1e7).
SLICES: dict[str, tuple[str, list[str]]] = {
    "lpo_minatar": ("lpo_minatar.toml", [
        "inner.total_timesteps=499712",  # 61 of the file's 1220 updates
    ]),
    "learned_optimizer_gpu": ("learned_optimizer_gpu.toml", [
        "inner.0.total_timesteps=499712", "inner.1.total_timesteps=499712",
        "inner.2.total_timesteps=24576", "inner.3.total_timesteps=499712",
    ]),
    "lpo_brax": ("lpo_brax.toml", [
        "inner.total_timesteps=409600",  # 20 of the file's 2441 updates
    ]),
    "pbt_sac_halfcheetah_gpu": ("pbt_sac_halfcheetah_gpu.toml", [
        "pbt.segment_updates=78",  # 300 segments of 78 updates instead of 30 of 780
        "inner.learning_starts=1280",
    ]),
    "cem_rl_hopper_gpu": ("cem_rl_hopper_gpu.toml", [
        "inner.learning_starts=1000",
    ]),
    "dvd_td3_humanoid_gpu": ("dvd_td3_humanoid_gpu.toml", [
        "dvd.segment_updates=25",  # 625 segments of 25 updates instead of 125 of 125
        "inner.learning_starts=1280",
    ]),
}

# --smoke: shapes small enough for a CPU, to check the script end to end.
SMOKE: dict[str, list[str]] = {
    "lpo_minatar": ["es.population_size=2", "fitness.seeds_per_candidate=1",
                    "inner.num_envs=4", "inner.num_steps=8", "inner.total_timesteps=64",
                    "inner.num_minibatches=2", "run.chunk_size=2"],
    "learned_optimizer_gpu": ["es.population_size=2", "inner.num_envs=4", "inner.num_steps=8",
                              "inner.total_timesteps=64", "inner.num_minibatches=2",
                              "run.chunk_size=2", "objective.options.hidden_sizes=[4]"],
    "lpo_brax": ["es.population_size=2", "inner.num_envs=4", "inner.num_steps=4",
                 "inner.total_timesteps=32", "inner.num_minibatches=2",
                 "inner.hidden_sizes=[8]", "run.chunk_size=2"],
    "pbt_sac_halfcheetah_gpu": ["pbt.population_size=4", "inner.num_envs=2",
                                "inner.train_frequency=2", "inner.gradient_steps=1",
                                "inner.total_timesteps=64", "pbt.segment_updates=4",
                                "inner.buffer_size=64", "inner.batch_size=8",
                                "inner.learning_starts=8", "inner.actor_hidden_sizes=[8]",
                                "inner.critic_hidden_sizes=[8]", "run.chunk_size=2"],
    "cem_rl_hopper_gpu": ["cem_rl.population_size=4", "cem_rl.num_elites=2",
                          "inner.eval_max_steps=16", "inner.buffer_size=256",
                          "inner.batch_size=8", "inner.learning_starts=8",
                          "inner.actor_hidden_sizes=[8]", "inner.critic_hidden_sizes=[8]",
                          "inner.eval_episodes=1"],
    "dvd_td3_humanoid_gpu": ["dvd.population_size=2", "inner.num_envs=2", "inner.policy_delay=1",
                             "inner.train_frequency=2", "inner.gradient_steps=1",
                             "inner.total_timesteps=64", "dvd.segment_updates=4",
                             "inner.buffer_size=64", "inner.batch_size=8",
                             "inner.learning_starts=8", "inner.actor_hidden_sizes=[8]",
                             "inner.critic_hidden_sizes=[8]", "inner.eval_max_steps=16",
                             "inner.eval_episodes=1", "dvd.embedding_states=4"],
}


def _set(data: dict, overrides: list[str]) -> dict:
    """``--set`` overrides applied to raw TOML data, as ``metarl.config.apply_overrides``
    does (imported lazily: the orchestrator keeps JAX out of its process)."""
    from metarl.config import apply_overrides

    return apply_overrides(data, overrides)


def _inners(data: dict) -> list[dict]:
    inner = data.get("inner", {})
    return [inner] if isinstance(inner, dict) else list(inner)


def _ppo_steps(inner: dict) -> int:
    """Environment steps one PPO agent takes: whole updates of num_envs x num_steps."""
    batch = inner.get("num_envs", 4) * inner.get("num_steps", 128)
    return inner["total_timesteps"] // batch * batch


def budget(data: dict) -> tuple[int, int]:
    """(steps of the run, agent-steps of one step) that the experiment data asks for.

    The same arithmetic as the kinds' programs (``agent_steps_per_step``), checked against
    the slice's measured first line by :func:`run_slice`.
    """
    kind = data.get("kind", "evolve")
    if kind == "evolve":
        es, fitness = data["es"], data.get("fitness", {})
        per_agent = sum(_ppo_steps(inner) for inner in _inners(data))
        return es["generations"], (es["population_size"]
                                   * fitness.get("seeds_per_candidate", 2) * per_agent)
    table = data[kind]
    if kind == "cem_rl":  # episodes of varying length: one step's agent-steps are measured
        return table["generations"], 0
    inner = data["inner"]
    per_update = inner["num_envs"] * inner.get("train_frequency", 1)
    updates = inner["total_timesteps"] // per_update
    segment = table["segment_updates"]
    return updates // segment, table["population_size"] * segment * per_update


def run_slice(name: str, steps: int, limit: float, smoke: bool, work: Path) -> dict:
    """Run one experiment file's slice; its metrics lines and the projection of the file."""
    file, overrides = SLICES[name]
    if smoke:
        overrides = overrides + SMOKE[name]
    path = EXPERIMENTS / file
    full = tomllib.loads(path.read_text())
    sliced = _set(full, overrides)
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "metarl", "run", f"experiments/{file}", "--run-dir",
               str(run_dir), "--no-plots"] + [a for o in overrides for a in ("--set", o)]
    result: dict = {"file": f"experiments/{file}", "overrides": overrides,
                    "command": " ".join(["metarl"] + command[3:])}
    metrics = run_dir / "metrics.jsonl"
    started = time.perf_counter()
    with open(work / f"{name}.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        lines: list[dict] = []
        while process.poll() is None and time.perf_counter() - started < limit:
            time.sleep(0.5)
            if metrics.exists():
                lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
                if len(lines) >= steps:
                    break
        stopped = process.poll() is None
        if stopped:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    if metrics.exists():
        lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    result["exit"] = "stopped after its steps" if stopped and len(lines) >= steps else (
        "time limit" if stopped else process.returncode)
    result["log_tail"] = (work / f"{name}.log").read_text()[-1500:]
    keep = ("seconds", "agent_steps", "agent_steps_per_second", "devices", "best_fitness",
            "mean_fitness", "mean_return", "best_score", "median_score", "score")
    result["lines"] = [{k: v for k, v in line.items() if k in keep} for line in lines]
    if len(lines) < 2:
        return result
    full_steps, full_per_step = budget(full)
    _, sliced_per_step = budget(sliced)
    measured_per_step = lines[0]["agent_steps"]
    if sliced_per_step == 0:  # cem_rl: not sliced, one step's agent-steps as measured
        sliced_per_step = full_per_step = measured_per_step
    steady = min(line["seconds"] for line in lines[1:])
    rate = sliced_per_step / steady
    result.update({
        "agent_steps_per_step": {"slice": sliced_per_step, "measured": measured_per_step,
                                 "full_file": full_per_step},
        "steady_seconds_per_step": round(steady, 3),
        "agent_steps_per_second": round(rate),
        "first_step_seconds": round(lines[0]["seconds"], 2),
        "compile_seconds_estimate": round(lines[0]["seconds"] - steady, 1),
        "full_file_steps": full_steps,
        "projected_seconds_per_full_step": round(full_per_step / rate, 1),
        "projected_hours_full_file": round(full_steps * full_per_step / rate / 3600, 2),
    })
    return result


def run_throughput(populations: list[int], timesteps: int, limit: float) -> list[dict]:
    """PPO's ``jit(vmap(train))`` on CartPole by population (benchmarks/throughput.py)."""
    results = []
    started = time.perf_counter()
    for population in populations:
        left = limit - (time.perf_counter() - started)
        if left < 10:
            results.append({"population": population, "skipped": "time limit"})
            continue
        try:
            out = subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--single",
                 str(population), "--total-timesteps", str(timesteps), "--repeats", "2",
                 "--devices", "1"], capture_output=True, text=True, timeout=left, cwd=ROOT)
            if out.returncode == 0:
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            else:
                results.append({"population": population, "error": out.stderr[-1500:]})
        except subprocess.TimeoutExpired:
            results.append({"population": population, "skipped": "time limit"})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def run_main_job(limit: float, smoke: bool, work: Path) -> dict:
    """The quick start's main job, end to end, as a user starts it."""
    run_dir = work / "main_job"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "metarl", "run",
               "experiments/value_distance_cartpole.toml", "--run-dir", str(run_dir),
               "--no-plots"] + (["--set", "es.generations=2"] if smoke else [])
    started = time.perf_counter()
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=limit, cwd=ROOT)
        exit_code: int | str = out.returncode
        tail = (out.stdout + out.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        exit_code, tail = "time limit", ""
    wall = time.perf_counter() - started
    metrics = run_dir / "metrics.jsonl"
    lines = ([json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
             if metrics.exists() else [])
    return {"command": "metarl run experiments/value_distance_cartpole.toml",
            "exit": exit_code, "wall_seconds": round(wall, 1), "generations": len(lines),
            "generation_seconds": [round(line["seconds"], 2) for line in lines],
            "best_fitness_so_far": lines[-1]["best_fitness_so_far"] if lines else None,
            "log_tail": tail}


def environment() -> dict:
    """Versions and the accelerator, read in a subprocess (the orchestrator keeps JAX out)."""
    probe = ("import json, jax; from importlib.metadata import version; d = jax.devices(); "
             "print(json.dumps({**{name: version(name) for name in ('jax', 'jaxlib', 'flax', "
             "'optax', 'evosax', 'gymnax', 'brax', 'mujoco', 'orbax-checkpoint')}, "
             "'backend': jax.default_backend(), 'devices': [str(x) for x in d], "
             "'device_kind': d[0].device_kind}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    info = (json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0
            else {"error": out.stderr[-2000:]})
    gpu = shutil.which("nvidia-smi")
    if gpu:
        smi = subprocess.run([gpu, "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    info.update({"python": platform.python_version(), "cpu_count": os.cpu_count(),
                 "machine": platform.machine()})
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--only", nargs="+", choices=sorted(SLICES), default=list(SLICES),
                        help="experiment files to slice, in this order (default: all)")
    parser.add_argument("--steps", type=int, default=3, help="metrics lines per slice")
    parser.add_argument("--slice-limit", type=float, default=150,
                        help="seconds at most per slice (default 150)")
    parser.add_argument("--deadline", type=float, default=3600,
                        help="seconds at most for everything (default 3600)")
    parser.add_argument("--populations", type=int, nargs="+", default=[1, 64, 1024, 4096])
    parser.add_argument("--throughput-timesteps", type=int, default=131_072)
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-main-job", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes (for a CPU): checks the script, measures nothing")
    parser.add_argument("--work", type=Path, default=Path("/tmp/metarl-gpu-experiments"),
                        help="run directories and logs of the slices")
    args = parser.parse_args()
    started = time.perf_counter()

    def left() -> float:
        return args.deadline - (time.perf_counter() - started)

    args.work.mkdir(parents=True, exist_ok=True)
    report: dict = {"benchmark": "gpu_experiments", "smoke": args.smoke,
                    "command": " ".join(["python", "benchmarks/gpu_experiments.py"]
                                        + sys.argv[1:]),
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "environment": environment(), "slices": {}}

    def write() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")

    write()
    if not args.no_throughput:
        report["throughput"] = {
            "settings": "PureJaxRL CartPole-v1: 4 envs x 128 steps, 4 epochs x 4 minibatches, "
                        "64-64 tanh; one device",
            "total_timesteps_per_agent": args.throughput_timesteps,
            "results": run_throughput([2, 4] if args.smoke else args.populations,
                                      1024 if args.smoke else args.throughput_timesteps,
                                      min(150.0, left())),
        }
        write()
    if not args.no_main_job and left() > 30:
        report["main_job"] = run_main_job(min(180.0, left()), args.smoke, args.work)
        write()
    for name in args.only:
        if left() < 30:
            report["slices"][name] = {"skipped": "deadline"}
            continue
        print(f"slice {name}", file=sys.stderr, flush=True)
        report["slices"][name] = run_slice(name, args.steps, min(args.slice_limit, left()),
                                           args.smoke, args.work)
        write()
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    write()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
