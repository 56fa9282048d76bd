"""Soak test of killing and resuming: a run killed with SIGKILL at random moments, many
times, and resumed each time, must finish equal to the same run left alone.

Runs a tiny evolution (``metarl run``) once uninterrupted as the reference, then again
under a killer, in a fresh directory per run: each attempt starts ``metarl run`` (or
``metarl resume`` once the directory holds a config), waits a random time and sends SIGKILL;
a run ends when an attempt finishes before its kill (or is left to finish after
``--max-kills-per-run`` kills), and new runs are killed until ``--kills`` kills are done.
Kill moments are drawn uniformly over the attempt's expected life (start-up and
compilation included), or, for ``--in-loop`` of them, uniformly over the remaining
generations once the attempt has written its first new generation (where the saves are).
After every kill the run's files must parse; at the end of every run its metrics (timing
fields aside) and meta-parameters must equal the reference bit for bit.

    python benchmarks/soak_resume.py --kills 30 --generations 12

Not part of the test suite (it takes minutes). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMING_FIELDS = ("seconds", "agent_steps_per_second", "time")
CONFIG = """
name = "soak"
[objective]
name = "value_distance"
options = {{ hidden_sizes = [8] }}
[inner]
env_id = "CartPole-v1"
num_envs = 4
num_steps = 32
total_timesteps = 4096
hidden_sizes = [16]
update_epochs = 2
num_minibatches = 2
[es]
population_size = 4
generations = {generations}
sigma = 0.05
[fitness]
seeds_per_candidate = 2
[run]
checkpoint_every = {checkpoint_every}
keep_checkpoints = 2
progress = false
"""


def child_env(cache_dir: Path) -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "JAX_NUM_CPU_DEVICES": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
            "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH"))
                                          if p)}


def command(config: Path, run_dir: Path) -> list[str]:
    if (run_dir / "config.json").is_file():
        return [sys.executable, "-m", "metarl.cli", "resume", str(run_dir), "--no-plots"]
    return [sys.executable, "-m", "metarl.cli", "run", str(config), "--run-dir",
            str(run_dir), "--no-plots"]


def metrics_without_timing(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if line.strip()]
    return [{k: v for k, v in line.items() if k not in TIMING_FIELDS} for line in lines]


def check_files_parse(run_dir: Path) -> list[str]:
    """Names of the run's files that exist but do not parse."""
    from flax import serialization

    broken = []
    for name in ("config.json", "status.json"):
        path = run_dir / name
        if path.exists():
            try:
                json.loads(path.read_text())
            except ValueError:
                broken.append(name)
    for name in ("metrics.jsonl", "config_history.jsonl"):
        path = run_dir / name
        if path.exists():
            try:
                [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            except ValueError:
                broken.append(name)
    for name in ("best_meta_params.msgpack", "mean_meta_params.msgpack"):
        path = run_dir / name
        if path.exists():
            try:
                serialization.msgpack_restore(path.read_bytes())
            except Exception:  # noqa: BLE001 - any failure to parse counts
                broken.append(name)
    return broken


def last_generation(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return max((json.loads(line).get("generation", 0) for line in lines if line.strip()),
                   default=0)
    except (OSError, ValueError):
        return 0


def newest_checkpoint(run_dir: Path) -> int:
    folder = run_dir / "checkpoints"
    steps = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() \
        else []
    return max(steps, default=0)


def run_reference(config: Path, run_dir: Path, env: dict) -> dict:
    """Run once uninterrupted, timing start-up (until the first generation is written) and
    the generations (first to last line of ``metrics.jsonl``)."""
    started = time.monotonic()
    process = subprocess.Popen(command(config, run_dir), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = last = None
    while process.poll() is None:
        generation = last_generation(run_dir)
        if generation >= 1 and first is None:
            first = time.monotonic() - started
        if generation >= 1:
            last = time.monotonic() - started
        time.sleep(0.005)
    err = process.stderr.read()
    process.stderr.close()
    if process.returncode != 0:
        raise SystemExit(f"reference run failed:\n{err[-3000:]}")
    total = time.monotonic() - started
    first = first if first is not None else total
    last = last if last is not None else total
    return {"seconds": total, "start_up_seconds": first, "loop_seconds": last - first}


def same_run(run_dir: Path, reference: Path) -> tuple[bool, bool]:
    """(metrics equal without timing fields, meta-parameters equal), bit for bit."""
    import numpy as np
    from flax import serialization

    def params(run: Path, name: str):
        return serialization.msgpack_restore((run / name).read_bytes())

    def same_tree(a, b) -> bool:
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(
                same_tree(a[k], b[k]) for k in a)
        return np.array_equal(np.asarray(a), np.asarray(b))

    if not (run_dir / "metrics.jsonl").exists():
        return False, False
    metrics = metrics_without_timing(run_dir) == metrics_without_timing(reference)
    meta = all(same_tree(params(run_dir, name), params(reference, name))
               for name in ("mean_meta_params.msgpack", "best_meta_params.msgpack"))
    return metrics, meta


def soak_round(config: Path, run_dir: Path, env: dict, rng: random.Random, args,
               timing: dict, max_kills: int) -> dict:
    """Kill and resume one run until it finishes by itself (or after ``max_kills`` kills,
    when the next attempt is left to finish)."""
    per_generation = max(0.01, timing["loop_seconds"] / max(1, args.generations - 1))
    kills, unexpected, broken_after_kill, attempts = [], [], [], 0
    while True:
        attempts += 1
        resumed_from = newest_checkpoint(run_dir)
        started = time.monotonic()
        process = subprocess.Popen(command(config, run_dir), env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        killed = False
        if len(kills) < max_kills:
            remaining = max(1, args.generations - resumed_from)
            in_loop = rng.random() < args.in_loop
            if in_loop:  # wait for this attempt's first new generation, then a moment
                while process.poll() is None and last_generation(run_dir) <= resumed_from:
                    time.sleep(0.002)
                delay = rng.uniform(0, remaining * per_generation)
            else:
                delay = rng.uniform(0, timing["start_up_seconds"]
                                    + remaining * per_generation)
            deadline = time.monotonic() + delay
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                killed = True
        process.wait()
        err = process.stderr.read()
        process.stderr.close()
        if killed:
            kills.append({"attempt": attempts, "phase": "loop" if in_loop else "anywhere",
                          "after_seconds": round(time.monotonic() - started, 3),
                          "resumed_from": resumed_from,
                          "checkpoint_after": newest_checkpoint(run_dir)})
            broken = check_files_parse(run_dir)
            if broken:
                broken_after_kill.append({"attempt": attempts, "files": broken})
            continue
        if process.returncode != 0:
            unexpected.append({"attempt": attempts, "code": process.returncode,
                               "stderr": err[-2000:]})
            if len(unexpected) > 3:
                break
            continue
        if newest_checkpoint(run_dir) >= args.generations:
            break
    metrics_equal, params_equal = same_run(run_dir, run_dir.parent / "reference")
    damaged = sorted(p.name for p in (run_dir / "damaged-checkpoints").iterdir()) \
        if (run_dir / "damaged-checkpoints").is_dir() else []
    return {"kills": kills, "attempts": attempts, "metrics_equal": metrics_equal,
            "meta_params_equal": params_equal, "unexpected_exits": unexpected,
            "files_broken_after_a_kill": broken_after_kill,
            "moved_to_damaged_checkpoints": damaged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30, help="SIGKILLs in all")
    parser.add_argument("--max-kills-per-run", type=int, default=8,
                        help="after this many kills a run is left to finish, and the next "
                             "run starts")
    parser.add_argument("--generations", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--in-loop", type=float, default=0.5,
                        help="share of kills aimed at the generation loop")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--workdir", default=None, help="where to write the runs "
                                                        "(default: a temporary folder)")
    parser.add_argument("--cache-dir", default=None,
                        help="JAX compilation cache (default: <workdir>/jax-cache)")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="metarl-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for old in [workdir / "reference", *workdir.glob("soaked-*")]:
        shutil.rmtree(old, ignore_errors=True)
    config = workdir / "soak.toml"
    config.write_text(CONFIG.format(generations=args.generations,
                                    checkpoint_every=args.checkpoint_every))
    env = child_env(Path(args.cache_dir) if args.cache_dir else workdir / "jax-cache")
    began = time.monotonic()
    timing = run_reference(config, workdir / "reference", env)

    rounds = []
    while sum(len(r["kills"]) for r in rounds) < args.kills:
        left = args.kills - sum(len(r["kills"]) for r in rounds)
        rounds.append(soak_round(config, workdir / f"soaked-{len(rounds) + 1}", env, rng,
                                 args, timing, min(left, args.max_kills_per_run)))
        if rounds[-1]["unexpected_exits"] and len(rounds[-1]["unexpected_exits"]) > 3:
            break

    kills = [kill for r in rounds for kill in r["kills"]]
    equal = all(r["metrics_equal"] and r["meta_params_equal"] for r in rounds)
    clean = not any(r["unexpected_exits"] or r["files_broken_after_a_kill"] for r in rounds)
    report = {
        "kills": len(kills),
        "runs": len(rounds),
        "attempts": sum(r["attempts"] for r in rounds),
        "kills_in_loop": sum(k["phase"] == "loop" for k in kills),
        "kills_before_first_checkpoint": sum(k["checkpoint_after"] == 0 for k in kills),
        "kills_after_the_last_checkpoint": sum(k["checkpoint_after"] >= args.generations
                                               for k in kills),
        "generations": args.generations,
        "checkpoint_every": args.checkpoint_every,
        "equal": equal,
        "every_run_equal": [bool(r["metrics_equal"] and r["meta_params_equal"])
                            for r in rounds],
        "files_broken_after_a_kill": [b for r in rounds
                                      for b in r["files_broken_after_a_kill"]],
        "unexpected_exits": [u for r in rounds for u in r["unexpected_exits"]],
        "moved_to_damaged_checkpoints": [r["moved_to_damaged_checkpoints"] for r in rounds],
        "reference_seconds": round(timing["seconds"], 1),
        "reference_start_up_seconds": round(timing["start_up_seconds"], 1),
        "total_seconds": round(time.monotonic() - began, 1),
        "kill_log": [{"run": i + 1, **k} for i, r in enumerate(rounds) for k in r["kills"]],
        "workdir": str(workdir),
    }
    print(json.dumps(report, indent=1))
    sys.exit(0 if equal and clean else 1)


if __name__ == "__main__":
    main()
