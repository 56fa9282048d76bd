"""Does a value distance meta-trained on several environments transfer better than one
meta-trained on one?

Runs two experiments that differ only in what they meta-train on, for evolution seeds
``0 .. N-1`` (``--evolution-seeds N``, ``run.seed`` = the evolution seed), each through the
``metarl`` command as a user runs it:

- ``experiments/value_distance_classic.toml``: the ``classic`` suite's meta-train side
  (CartPole-v1, Catch-bsuite, UmbrellaChain-bsuite);
- ``experiments/value_distance_classic_cartpole.toml``: CartPole-v1 alone, at the suite's
  CartPole settings (``[suite] train = ["CartPole-v1"]``), with the same objective, search,
  generations, candidates and seeds per candidate.

Each run is ``metarl run EXPERIMENT --time-limit T`` and then ``metarl resume --time-limit
T`` until it has finished; a run directory under ``--runs-dir`` that has finished is reused
as it is, one stopped or interrupted is resumed (one made with another config is refused).
Then ``metarl evaluate RUN --suite classic --tune`` judges it on every environment of the
suite against its tuned baselines, all runs with one training store (``--runs-dir``/store),
so the baselines are trained once for all of them.

Everything is judged on classic's meta-test side (Acrobot-v1, Pendulum-v1, DeepSea-bsuite,
DiscountingChain-bsuite), which neither experiment trains on. An evaluation record pools
over the environments its run never trained on, which for the CartPole-only run also takes
in Catch and UmbrellaChain; so beside the record's own pooled rows (``pooled``, with
``pooled_over``) the output holds ``meta_test_pooled``: the same pooled rows
(:func:`metarl.evolve.suite_verdicts.suite_section`, from the record's held-out rows and
per-environment untrained-policy IQMs) over the meta-test side alone, the rows to compare
between the two experiments. For the multi-environment run the two are the same rows
(``meta_test_pooled_matches_record``).

With several evolution seeds the output also holds ``across_seeds``: per experiment and
tuned baseline, P(improvement) stratified over evolution seed x meta-test environment (each
stratum paired on the held-out seeds, which every run shares) and the normalised IQM over
all three; and ``head_to_head``, the multi-environment run of each evolution seed against
the CartPole-only run of the same seed, pooled the same way (the study's question), with
each evolution seed's own comparison beside it.

One evolution seed (the default) says how one search went; **three are needed before any
claim** about meta-training on several environments.

Cost on the 2-core CPU, measured for evolution seed 0 (docs/results/multi_env_transfer.json):
the multi-environment run 24 min of wall alone (1,405 s of generation steps), the CartPole
run 387 s of generation steps, the first evaluation about 19 min from an empty store (every
environment compiles its programs and trains every baseline), the second 153 s (80 of its 91
trainings from the store): about 52 min in all. Seeds 1 and 2 took 31 and 28 min (the
multi-environment runs 1,425 s and 702 s of wall, the first partly beside a test run, the
CartPole runs 398 s and 379 s, each evaluation 172 to 210 s with 70 of its 91 trainings from
the store, since every run is judged on the same held-out seeds). The
smoke took 43 min of wall at nice 19 beside another job (load 3-6): 12 min the first run,
28 min the first evaluation, 2 min the rest.

    python benchmarks/studies/multi_env_transfer.py --evolution-seeds 3 \\
        --runs-dir runs/multi_env_transfer --out docs/results/multi_env_transfer.json \\
        --figure docs/results/suites/multi_env_transfer.png
    python benchmarks/studies/multi_env_transfer.py \\
        --from-record docs/results/multi_env_transfer.json \\
        --figure docs/results/suites/multi_env_transfer.png   # the figure alone
    python benchmarks/studies/multi_env_transfer.py --smoke --out /tmp/multi_env_smoke.json

``--smoke`` shrinks everything through ``--set`` (one generation of 2 candidates, one seed
per candidate, every meta-train task at 4 environments x 32 steps x 16 updates, 2 baseline
seeds) and the evaluation's options (2 held-out seeds, 2 tuning seeds, the declared grids
only, L2 alone as the baseline), in a temporary runs directory unless ``--runs-dir`` is
given; the evaluation still trains at the suite's own budgets (``--suite`` fixes them),
which is most of its time. Writes one JSON document (``--out``) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SUITE = "classic"
EXPERIMENTS = ("value_distance_classic", "value_distance_classic_cartpole")
STOPPED_EXIT_CODE = 4  # metarl run/resume stopped by --time-limit, resumable
SMOKE_SETS = ("es.population_size=2", "es.generations=1", "fitness.seeds_per_candidate=1",
              "fitness.baseline_seeds=2", "suite.settings.num_envs=4",
              "suite.settings.num_steps=32", "suite.settings.total_timesteps=2048",
              "run.progress=false")
SMOKE_EVALUATE = ("--seeds", "2", "--tune-seeds", "2", "--tune-rounds", "0",
                  "--baselines", "l2")
RECORD_LINE = re.compile(r"^(?:saved|reusing|replaced) (\S+\.json)")


def metarl(*args: str) -> list[str]:
    return [sys.executable, "-m", "metarl", *args]


def call(command: list[str], log: list[dict]) -> subprocess.CompletedProcess:
    """Run ``command`` from the repository root, its output kept; logged with its exit
    code and seconds."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    log.append({"command": " ".join(command), "returncode": done.returncode,
                "seconds": round(time.perf_counter() - started, 1)})
    return done


def failed(done: subprocess.CompletedProcess) -> RuntimeError:
    return RuntimeError(f"{' '.join(done.args)} exited with {done.returncode}:\n"
                        f"{(done.stdout + done.stderr)[-3000:]}")


def evolve(experiment: str, seed: int, run_dir: Path, sets: list[str], time_limit: str,
           log: list[dict]) -> bool:
    """``metarl run`` then ``metarl resume`` until ``run_dir`` has finished. Returns
    whether a finished run directory was reused (nothing run)."""
    from metarl.kinds import load_experiment, read_config
    from metarl.runs.listing import run_info

    if run_dir.exists():
        wanted = load_experiment(experiment, sets)
        if read_config(run_dir) != wanted:
            raise RuntimeError(f"{run_dir} holds a run of another config than {experiment} "
                               f"with {sets}: give another --runs-dir or remove it")
        info = run_info(run_dir)
        if info.state == "finished":
            return True
        if info.checkpoint is None:
            raise RuntimeError(f"{run_dir} has no checkpoint to resume ({info.state}): "
                               "remove it to start the run again")
        command = metarl("resume", str(run_dir), "--no-plots", "--time-limit", time_limit)
    else:
        command = metarl("run", experiment, "--run-dir", str(run_dir), "--no-plots",
                         "--time-limit", time_limit, *[part for s in sets for part in ("--set", s)])
    while True:
        done = call(command, log)
        if done.returncode == 0:
            return False
        if done.returncode != STOPPED_EXIT_CODE:
            raise failed(done)
        command = metarl("resume", str(run_dir), "--no-plots", "--time-limit", time_limit)


def meta_test_pooled(record: dict) -> dict:
    """The record's pooled rows recomputed over the suite's meta-test side alone: the
    record's held-out rows, statistics and tuning, the untrained policy's floor per
    environment from the record's rows (an IQM, given as a one-seed result, which
    :func:`metarl.stats.aggregate` returns as it is)."""
    from metarl.evolve.suite_verdicts import suite_section

    section = record["suite"]
    suite = {key: section[key] for key in ("name", "version", "train", "test")}
    untrained = {row["environment"]: {"returns": [row["untrained_iqm"]]}
                 for row in section["environments"]}
    tuning = (record.get("tuning") or {}).get("environments")
    recomputed = suite_section(suite, record["results"], untrained, suite["train"],
                               record["statistics"], tuning)
    return {"pooled_over": recomputed["pooled_over"], "pooled": recomputed["pooled"]}


def evaluation_output(done: subprocess.CompletedProcess) -> tuple[Path, bool, str | None]:
    """What a finished ``metarl evaluate`` printed: its record's path, whether it reused an
    identical earlier evaluation instead of training, and the training store's summary line."""
    found = [m for line in done.stdout.splitlines() if (m := RECORD_LINE.match(line))]
    if len(found) != 1:
        raise RuntimeError(f"no record path in the output of {' '.join(done.args)}:\n"
                           f"{done.stdout[-3000:]}")
    store = [line for line in done.stdout.splitlines() if line.startswith("training store")]
    return (Path(found[0].group(1)), found[0].group(0).startswith("reusing"),
            store[-1] if store else None)


def evaluate(run_dir: Path, store: Path, flags: list[str], log: list[dict]) -> dict:
    """``metarl evaluate RUN --suite classic --tune``; the record's pooled rows and
    meta-test rows."""
    done = call(metarl("evaluate", str(run_dir), "--suite", SUITE, "--tune",
                       "--cache-dir", str(store), *flags), log)
    if done.returncode != 0:
        raise failed(done)
    path, _, store_line = evaluation_output(done)
    record = json.loads(path.read_text())
    section = record["suite"]
    mine = meta_test_pooled(record)
    return {
        "record": str(path), "record_id": record.get("id"), "eval_seed": record["eval_seed"],
        "seeds": record["seeds"], "store": store_line,
        "suite": {key: section[key] for key in ("name", "version", "train", "test")},
        "trained_on": section["trained_on"], "pooled_over": section["pooled_over"],
        "pooled": section["pooled"],
        "meta_test_pooled": mine["pooled"],
        "meta_test_pooled_matches_record": (
            mine["pooled_over"] == section["pooled_over"]
            and json.dumps(mine["pooled"], sort_keys=True)
            == json.dumps(section["pooled"], sort_keys=True)),
        "meta_test_rows": [row for row in section["environments"] if row["side"] == "test"],
    }


def across_seeds(runs: list[dict]) -> dict:
    """The meta-test side pooled over evolution seeds as well as environments: per
    experiment and tuned baseline, the suite's pooled row
    (:func:`metarl.evolve.suite_verdicts.pooled_row`) over (evolution seed, environment)
    strata, each paired on the held-out seeds and normalised between that environment's
    untrained policy and the baseline; then the two experiments against each other, the
    multi-environment run of evolution seed k against the CartPole-only run of seed k on the
    same held-out seeds (the study's question), pooled and per evolution seed. Every run
    must have been judged on the same held-out seeds (one ``eval_seed``)."""
    from metarl.evolve.judging import TUNED, held_out_scores
    from metarl.evolve.suite_verdicts import pooled_row
    from metarl.stats import stratified_probability_of_improvement, verdict

    roots = {run["evaluation"]["eval_seed"] for run in runs}
    if len(roots) != 1:
        return {"skipped": f"the runs were judged on different held-out roots {sorted(roots)}"}
    environments = list(runs[0]["evaluation"]["suite"]["test"])
    # experiment -> one stratum per (evolution seed, environment): label -> objective -> result
    strata: dict[str, dict[str, dict[str, dict]]] = {}
    floors: dict[str, dict] = {}  # stratum label -> the untrained policy's IQM, as a result
    for run in sorted(runs, key=lambda r: r["evolution_seed"]):
        record = json.loads(Path(run["evaluation"]["record"]).read_text())
        untrained = {row["environment"]: row["untrained_iqm"]
                     for row in run["evaluation"]["meta_test_rows"]}
        for env in environments:
            label = f"{env} (evolution seed {run['evolution_seed']})"
            strata.setdefault(run["experiment"], {})[label] = {
                result["objective"]: result for result in record["results"]
                if result["env_id"] == env}
            floors[label] = {"returns": [untrained[env]]}

    evolved = "evolved" + TUNED
    pooled = []
    for experiment in EXPERIMENTS:
        if experiment not in strata:
            continue
        by_label = strata[experiment]
        labels = list(by_label)
        baselines = [name for name in by_label[labels[0]]  # the record's order
                     if name.endswith(TUNED) and name != evolved]
        pooled += [{"experiment": experiment,
                    "evolution_seeds": len(labels) // len(environments),
                    **pooled_row(evolved, baseline, labels, by_label, floors)}
                   for baseline in baselines]

    def compare(x: np.ndarray, y: np.ndarray) -> dict:
        improvement = stratified_probability_of_improvement(x, y)
        return {"probability_of_improvement": improvement.to_dict(),
                "verdict": verdict(improvement.low, improvement.high)}

    head_to_head = None
    if all(experiment in strata for experiment in EXPERIMENTS):
        seeds = min(len(strata[e]) for e in EXPERIMENTS) // len(environments)
        x, y = (np.stack([held_out_scores(results[evolved])
                          for results in list(strata[experiment].values())[
                              :seeds * len(environments)]], axis=1)
                for experiment in EXPERIMENTS)
        width = len(environments)  # each evolution seed's columns, in order
        head_to_head = {"evolved": EXPERIMENTS[0], "baseline": EXPERIMENTS[1],
                        "evolution_seeds": seeds, **compare(x, y),
                        "per_evolution_seed": [
                            compare(x[:, k * width:(k + 1) * width],
                                    y[:, k * width:(k + 1) * width])
                            for k in range(seeds)]}
    return {"environments": environments, "eval_seed": roots.pop(),
            "strata": "evolution seed x environment, paired on the held-out seeds",
            "pooled": pooled, "head_to_head": head_to_head}

def plot_study(record: dict):
    """The study's answer as interval estimates: P(improvement) pooled over evolution seed x
    meta-test environment of each search over each tuned baseline, then of the
    multi-environment search over the CartPole-only one, pooled and per evolution seed (0.5
    dashed: no difference)."""
    from metarl.figures.style import new_figure
    from metarl.figures.suites import interval_bar

    across = record["across_seeds"]
    short = {EXPERIMENTS[0]: "3 environments", EXPERIMENTS[1]: "CartPole alone"}
    rows = [(f"{short[row['experiment']]} vs {row['baseline']}",
             row["probability_of_improvement"], "C0" if row["experiment"] == EXPERIMENTS[0]
             else "C7") for row in across["pooled"]]
    duel = across["head_to_head"]
    if duel:
        rows.append(("3 environments vs CartPole alone, pooled",
                     duel["probability_of_improvement"], "C3"))
        rows += [(f"  evolution seed {k}", seed["probability_of_improvement"], "C1")
                 for k, seed in enumerate(duel["per_evolution_seed"])]
    fig = new_figure(8.0, 1.0 + 0.42 * len(rows))
    ax = fig.subplots()
    for index, (_, estimate, colour) in enumerate(rows):
        interval_bar(ax, index, estimate, colour)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    ax.invert_yaxis()
    ax.axvline(0.5, color="grey", ls="--", lw=1)
    ax.set_xlim(-0.03, 1.03)
    seeds = max((row["evolution_seeds"] for row in across["pooled"]), default=0)
    ax.set_xlabel(f"P(improvement) on the {len(across['environments'])} meta-test "
                  f"environments, {seeds} evolution seeds")
    fig.suptitle("A value distance meta-trained on classic's meta-train side "
                 "or on CartPole alone", fontsize=10)
    return fig


def revision() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout.strip() or None


def conditions(date: str, load_start: tuple[float, ...], started: float) -> dict:
    """Where and how a study ran: its start date, the load average at its start and end,
    its wall seconds since ``started`` (``time.perf_counter``), the machine and revision."""
    return {"date": date, "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "wall_seconds": round(time.perf_counter() - started, 1),
            "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "revision": revision()}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command a study was run with: this process's, or ``script`` with ``argv`` when
    ``main`` was called with arguments."""
    if argv is None:
        return " ".join([sys.executable, *sys.argv])
    return " ".join([f"benchmarks/studies/{script}", *argv])


def emit(result: dict, out: str | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evolution-seeds", type=int, default=1,
                        help="evolution seeds 0..N-1 per experiment (default 1; 3 before "
                             "any claim)")
    parser.add_argument("--runs-dir", default=None,
                        help="where the run directories and the training store are kept "
                             "and reused (default: runs/multi_env_transfer; --smoke: a "
                             "temporary directory)")
    parser.add_argument("--time-limit", default="2h",
                        help="each metarl run/resume job's --time-limit (default 2h)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--figure", default=None,
                        help="also draw the study's intervals (plot_study) into this PNG")
    parser.add_argument("--from-record", default=None,
                        help="run nothing: draw --figure from this earlier output")
    args = parser.parse_args(argv)
    if args.from_record:
        if not args.figure:
            parser.error("--from-record: give --figure too")
        save_figure(json.loads(Path(args.from_record).read_text()), args.figure)
        return 0
    if args.evolution_seeds < 1:
        parser.error("--evolution-seeds: at least 1")

    started, load_start = time.perf_counter(), os.getloadavg()
    date = datetime.now(UTC).isoformat(timespec="seconds")
    runs_dir = Path(args.runs_dir or (tempfile.mkdtemp(prefix="multi-env-transfer-")
                                      if args.smoke else ROOT / "runs" / "multi_env_transfer"))
    runs_dir.mkdir(parents=True, exist_ok=True)
    sets = list(SMOKE_SETS) if args.smoke else []
    flags = list(SMOKE_EVALUATE) if args.smoke else []
    log: list[dict] = []
    runs = []
    for seed in range(args.evolution_seeds):
        for experiment in EXPERIMENTS:
            run_dir = runs_dir / f"{experiment}_seed{seed}"
            before = len(log)
            reused = evolve(experiment, seed, run_dir, [*sets, f"run.seed={seed}"],
                            args.time_limit, log)
            evolution_seconds = sum(entry["seconds"] for entry in log[before:])
            runs.append({"experiment": experiment, "evolution_seed": seed,
                         "run_dir": str(run_dir), "reused_finished_run": reused,
                         "evolution_seconds": round(evolution_seconds, 1),
                         "evaluation": evaluate(run_dir, runs_dir / "store" / "trainings",
                                                flags, log)})
    result = {
        "study": "multi_env_transfer",
        "question": "does a value distance meta-trained on classic's meta-train side "
                    "transfer to its meta-test side better than one meta-trained on "
                    "CartPole-v1 alone?",
        "suite": SUITE, "smoke": args.smoke, "evolution_seeds": args.evolution_seeds,
        "experiments": {name: f"experiments/{name}.toml" for name in EXPERIMENTS},
        "overrides": sets, "evaluate_flags": ["--suite", SUITE, "--tune", *flags],
        "runs_dir": str(runs_dir),
        "command": command_line("multi_env_transfer.py", argv),
        "commands": log,
        "runs": runs,
        "across_seeds": across_seeds(runs),
        "conditions": conditions(date, load_start, started),
    }
    emit(result, args.out)
    if args.figure:
        save_figure(result, args.figure)
    return 0


def save_figure(record: dict, path: str) -> None:
    from metarl.figures.style import save_png

    if not (record.get("across_seeds") or {}).get("pooled"):
        raise SystemExit("the record has no pooled rows (across_seeds) to draw")
    print(f"figure: {save_png(plot_study(record), path)}")


if __name__ == "__main__":
    sys.exit(main())
