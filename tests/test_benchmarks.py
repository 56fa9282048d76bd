"""The throughput benchmark runs end to end and reports what the README quotes from it."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _subprocess_env import env_without_device_count, jax_cache_env

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
STUDIES = BENCHMARKS / "studies"  # the one-off studies behind single records


def test_throughput_benchmark_reports_best_and_median_per_device_count():
    # one PPO update per agent (4 envs x 128 steps): the smallest run the settings allow
    command = [sys.executable, str(BENCHMARKS / "throughput.py"), "--populations", "2",
               "--devices", "1", "2", "--total-timesteps", "512", "--repeats", "3"]
    out = subprocess.run(command, env=env_without_device_count(**jax_cache_env()),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["env"] == "CartPole-v1"
    assert [(r["population"], r["devices"]) for r in report["results"]] == [(2, 1), (2, 2)]
    for row in report["results"]:
        assert row["agent_steps"] == 2 * 512
        assert len(row["run_seconds"]) == 3
        assert row["agent_steps_per_second"] >= row["median_agent_steps_per_second"] > 0
        assert math.isfinite(row["final_return_mean"])
        assert row["peak_rss_mb"] > 0
    # the same keys train the same agents whether or not the population is sharded
    one, two = report["results"]
    assert math.isclose(one["final_return_mean"], two["final_return_mean"], rel_tol=1e-5)


def _load_benchmark(name, folder=BENCHMARKS):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_attributes_own_time_and_phases_by_jax_names():
    profile = _load_benchmark("profile_ppo")
    # a while loop of 10 ns holding two operations of 3 and 4 ns, then one of 5 ns
    events = [(0, 10, "while.1"), (1, 3, "dot.2"), (5, 4, "fusion.3"), (20, 5, "dot.2")]
    assert profile.exclusive_times(events) == {"while.1": 3, "dot.2": 8, "fusion.3": 4}
    base = "jit(train)/vmap()/while/body/closed_call"
    assert profile.phase_of(f"{base}/rollout/while/body/ActorCritic/dot_general") == "rollout"
    assert profile.phase_of(f"{base}/while/loss/jvp(ActorCritic)/tanh") == "forward"
    assert profile.phase_of(f"{base}/loss/transpose(loss)/jvp(ActorCritic)/dot") == "backward"
    assert profile.phase_of(f"{base}/while/optimiser/mul") == "optimiser"
    assert profile.phase_of(f"{base}/while") == "other"
    hlo = ('  %dot.2 = f32[4,4]{1,0} dot(%a, %b), metadata={op_name="jit(f)/loss/dot"}\n'
           '  ROOT %fusion.3 = f32[4]{0} fusion(%c), kind=kLoop, '
           'metadata={op_name="jit(f)/gae/add" stack_frame_id=2}\n')
    assert profile.op_names(hlo) == {"dot.2": "jit(f)/loss/dot", "fusion.3": "jit(f)/gae/add"}


def test_profile_of_a_tiny_population_covers_every_phase():
    command = [sys.executable, str(BENCHMARKS / "profile_ppo.py"), "--population", "2",
               "--total-timesteps", "1024", "--runs", "1", "--top", "3"]
    out = subprocess.run(command, env=env_without_device_count(**jax_cache_env()),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["updates"] == 2
    assert math.isclose(sum(report["share"].values()), 1.0, abs_tol=1e-3)
    for phase in ("rollout", "gae", "shuffle", "forward", "backward", "optimiser"):
        assert report["share"][phase] > 0, (phase, report["share"])
    assert len(report["costliest_operations"]) == 3


def test_offpolicy_update_benchmark_captures_the_real_learn_step():
    # the benchmark times the learn function td3/sac hand to build_learner; if that
    # hand-over changes, the capture must fail here rather than time something else
    benchmark = _load_benchmark("offpolicy_update", STUDIES)
    for algorithm in ("td3", "sac"):
        learner, learn = benchmark.capture_update(algorithm, 8, "Pendulum-v1", 512)
        assert learner.algorithm == algorithm and callable(learn)
        assert learner.config.batch_size == 256
        assert learner.config.actor_hidden_sizes == (8, 8)
    args = benchmark.parse_args(["--populations", "1,16", "--sizes", "64", "--steps", "4"])
    assert args.populations == [1, 16] and args.modes == ["loop", "vmap", "sharded"]


def test_vs_rejax_offpolicy_gives_both_libraries_the_same_budget():
    # runs without rejax: only metarl's configs and the script's own arithmetic
    benchmark = _load_benchmark("vs_rejax_offpolicy")
    for algorithm, comparison in benchmark.COMPARISONS.items():
        args = benchmark.parse(["--algorithm", algorithm, "--total-timesteps", "20000"])
        config = comparison.metarl_config(algorithm, args)
        assert config.env_id == comparison.env_id and config.num_envs == comparison.num_envs
        # each library runs whole iterations; the budgets differ by less than one update
        rejax_steps = comparison.rejax_steps_per_agent(algorithm, 20_000)
        assert 0 <= rejax_steps - config.steps_per_agent < config.steps_per_update
    try:  # rejax 0.1.3 builds DQN's and TD3's networks 64-64 whatever it is asked
        benchmark.parse(["--algorithm", "td3", "--hidden", "128"])
    except SystemExit:
        pass
    else:
        raise AssertionError("--hidden 128 accepted for td3")


def test_vs_rejax_offpolicy_changes_metarl_fields_and_rejax_sampling_on_request():
    import types

    import jax
    import jax.numpy as jnp

    benchmark = _load_benchmark("vs_rejax_offpolicy")
    args = benchmark.parse(["--algorithm", "dqn", "--metarl-set", "max_grad_norm=1e6",
                            "--metarl-set", "td_loss='huber'"])
    changes = benchmark.metarl_overrides(args.metarl_set)
    assert changes == {"max_grad_norm": 1e6, "td_loss": "huber"}
    config = benchmark.COMPARISONS["dqn"].metarl_config("dqn", args).replace(**changes)
    assert (config.max_grad_norm, config.td_loss) == (1e6, "huber")
    try:
        benchmark.metarl_overrides(["max_grad_norm"])
    except SystemExit as error:
        assert "FIELD=VALUE" in str(error)
    else:
        raise AssertionError("a pair without '=' accepted")

    # the uniform sampler draws only from the filled part of a rejax-like buffer
    class Buffer:
        def __init__(self):
            self.num_entries = jnp.int32(5)
            self.data = {"obs": jnp.arange(100.0)}

    rejax = types.SimpleNamespace(buffers=types.SimpleNamespace(ReplayBuffer=Buffer))
    benchmark.use_uniform_sampling(rejax)
    batch = Buffer().sample(1000, jax.random.PRNGKey(0))["obs"]
    assert batch.shape == (1000,) and set(np.asarray(batch).tolist()) == {0, 1, 2, 3, 4}


def _suite_level_and_flags() -> tuple[str, str]:
    """The XLA backend optimisation level the suite compiles at (root conftest.py) and its
    other XLA flags, less any CPU device count."""
    flags = os.environ["XLA_FLAGS"].split()
    level = next(flag.split("=", 1)[1] for flag in flags
                 if flag.startswith("--xla_backend_optimization_level="))
    others = [flag for flag in flags if not flag.startswith(
        ("--xla_backend_optimization_level=", "--xla_force_host_platform_device_count"))]
    return level, " ".join(others)


def test_compile_time_benchmark_runs_each_level_in_its_own_process():
    """Every ``--levels`` entry compiles and runs in a child of its own, and the report
    gives each one's times and ratios and compares its outputs with the first's: two
    children at one level compile the same program and agree bit for bit."""
    # PPO's smallest run (one update), twice at the suite's own XLA settings, which compile
    # fastest: a second level would double this test's cost for no more coverage
    level, flags = _suite_level_and_flags()
    command = [sys.executable, str(BENCHMARKS / "compile_time.py"), "--algorithms", "ppo",
               "--levels", level, level, "--population", "1", "--repeats", "1",
               "--total-timesteps", "512", f"--xla-flags={flags}"]
    out = subprocess.run(command, env=env_without_device_count(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["settings"] == {"ppo": {"total_timesteps": 512}}
    assert report["xla_flags"] == flags
    first, row = report["results"]["ppo"]
    assert first["level"] == row["level"] == int(level)
    assert row["compile_seconds"] > 0 and row["run_seconds"] > 0
    assert row["compile_ratio_first_over_this"] > 0 and row["run_ratio_first_over_this"] > 0
    # the two children compiled and ran the same program: bit for bit the same outputs
    assert row["identical_to_first"] and row["max_difference_to_first"] == 0.0


def test_compile_time_benchmark_finds_the_largest_difference_between_outputs(tmp_path):
    compile_time = _load_benchmark("compile_time")
    first, other = tmp_path / "first.npz", tmp_path / "other.npz"
    np.savez(first, np.array([1.0, 2.0], np.float32), np.arange(3), np.zeros((0,)))
    np.savez(other, np.array([1.0, 2.5], np.float32), np.arange(3), np.zeros((0,)))
    assert compile_time.max_difference(str(first), str(other)) == 0.5
    assert compile_time.max_difference(str(first), str(first)) == 0.0


def test_compile_time_benchmark_refuses_levels_xla_does_not_have():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "compile_time.py"), "--levels",
                          "3", "4"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "0 to 3" in out.stderr


def test_gpu_experiment_slices_are_valid_and_their_budget_matches_the_recorded_runs():
    gpu = _load_benchmark("gpu_experiments")
    from metarl.kinds import load_experiment

    for name, (file, overrides) in gpu.SLICES.items():
        path = Path(gpu.EXPERIMENTS) / file
        load_experiment(path, overrides)  # typed and validated, as `metarl run --set` does
        load_experiment(path, overrides + gpu.SMOKE[name])
    # the budget arithmetic equals the agent-steps the kinds' programs reported on the GPU
    results = BENCHMARKS.parent / "docs" / "results"
    recorded = {}
    for record in ("gpu_experiments.json", "gpu_experiments_offpolicy.json"):
        for name, row in json.loads((results / record).read_text())["slices"].items():
            if "agent_steps_per_step" in row:
                recorded[name] = row["agent_steps_per_step"]
    assert {"lpo_minatar", "lpo_brax", "pbt_sac_halfcheetah_gpu"} <= set(recorded)
    for name, steps in recorded.items():
        assert steps["slice"] == steps["measured"], name
        file, overrides = gpu.SLICES[name]
        data = gpu.tomllib.loads((Path(gpu.EXPERIMENTS) / file).read_text())
        if data.get("kind", "evolve") != "cem_rl":
            assert gpu.budget(gpu._set(data, overrides))[1] == steps["slice"], name
            assert gpu.budget(data)[1] == steps["full_file"], name


def test_the_benchmarks_readme_lists_every_script_in_its_section():
    # benchmarks/README.md is how a newcomer tells maintained benchmarks from studies
    text = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    maintained, studies = text.split("\n## Studies", 1)
    listed = {folder: set(re.findall(r"^\| `(\w+\.py)` \|", section, re.MULTILINE))
              for folder, section in ((BENCHMARKS, maintained), (STUDIES, studies))}
    for folder, names in listed.items():
        scripts = {path.name for path in folder.glob("*.py") if not path.name.startswith("_")}
        assert names == scripts, folder
    # lower-case names only: the introduction writes `benchmarks/NAME.py` for any script
    for path in re.findall(r"python3? (benchmarks/[a-z_/]+\.py)", text):
        assert (BENCHMARKS.parent / path).is_file(), path


def test_the_judging_cost_study_counts_differing_numbers_but_not_timings():
    judging_cost = _load_benchmark("judging_cost", STUDIES)
    record = {"rows": [{"iqm": 1.0, "returns": [1.0, 2.0]}], "train_seconds": 3.0,
              "created": "2026-11-29", "verdict": "better"}
    same_but_slower = {**record, "train_seconds": 9.0, "created": "2026-11-30"}
    assert judging_cost.numbers_differing(record, same_but_slower) == 0
    rounded = {**record, "rows": [{"iqm": 1.0000001, "returns": [1.0, 2.0000002]}]}
    assert judging_cost.numbers_differing(record, rounded) == 2
    assert judging_cost.numbers_differing(record, {**record, "verdict": "worse"}) == 1
    assert judging_cost.numbers_differing(record, {"rows": []}) == 1  # another structure


def _study_run(tmp_path, experiment, seed, evolved_shift, environments, held_out=16):
    """One run of the multi-environment study as ``across_seeds`` reads it: an evaluation
    record on disk whose tuned baselines score ``k + env`` on held-out seed ``k`` and
    whose evolved row scores the same plus ``evolved_shift``; the untrained floor is -10."""
    results = []
    for index, env in enumerate(environments):
        base = np.arange(held_out, dtype=float) + index
        for name, shift in (("evolved", evolved_shift), ("ppo", 0.0), ("l2", 0.0)):
            results.append({"objective": f"{name} (tuned)", "env_id": env,
                            "returns": list(base + shift), "valid": [True] * held_out})
    path = tmp_path / f"{experiment}_{seed}.json"
    path.write_text(json.dumps({"results": results}))
    rows = [{"environment": env, "untrained_iqm": -10.0} for env in environments]
    return {"experiment": experiment, "evolution_seed": seed,
            "evaluation": {"record": str(path), "eval_seed": 10007,
                           "suite": {"test": environments}, "meta_test_rows": rows}}


def test_the_multi_environment_study_pools_over_evolution_seeds_and_environments(tmp_path):
    study = _load_benchmark("multi_env_transfer", STUDIES)
    many, one = study.EXPERIMENTS
    environments = ["Acrobot-v1", "Pendulum-v1"]
    # planted: the multi-environment objective beats everything on every seed; the
    # CartPole-only one equals the baselines on one evolution seed and loses on the other
    runs = [_study_run(tmp_path, many, 0, 0.5, environments),
            _study_run(tmp_path, one, 0, 0.0, environments),
            _study_run(tmp_path, many, 1, 0.5, environments),
            _study_run(tmp_path, one, 1, -0.5, environments)]
    found = study.across_seeds(runs)
    pooled = {(row["experiment"], row["baseline"]): row for row in found["pooled"]}
    assert list(pooled) == [(many, "ppo (tuned)"), (many, "l2 (tuned)"),
                            (one, "ppo (tuned)"), (one, "l2 (tuned)")]
    better = pooled[(many, "ppo (tuned)")]
    assert better["evolution_seeds"] == 2
    assert better["probability_of_improvement"]["value"] == 1.0
    assert better["verdict"] == "transfers"
    # ties on seed 0 count a half, losses on seed 1 nothing: (0.5 + 0) / 2 over the strata
    mixed = pooled[(one, "l2 (tuned)")]
    assert mixed["probability_of_improvement"]["value"] == 0.25
    assert mixed["verdict"] == "worse"
    # the baseline normalised by itself sits at 1 (its IQM), the untrained floor at 0
    assert pooled[(one, "l2 (tuned)")]["normalised_iqm"]["l2 (tuned)"]["value"] == (
        pytest.approx(1.0, abs=0.05))
    head = found["head_to_head"]
    assert (head["evolved"], head["baseline"], head["evolution_seeds"]) == (many, one, 2)
    assert head["probability_of_improvement"]["value"] == 1.0 and head["verdict"] == "better"
    assert [seed["verdict"] for seed in head["per_evolution_seed"]] == ["better", "better"]
    # the figure: one interval per pooled row, the head-to-head and each evolution seed's
    figure = study.plot_study({"across_seeds": found})
    labels = [tick.get_text() for tick in figure.axes[0].get_yticklabels()]
    assert len(labels) == 4 + 1 + 2 and labels[4].endswith("pooled")
    # runs judged on different held-out seeds cannot be pooled
    runs[1]["evaluation"]["eval_seed"] = 10008
    assert "different held-out roots" in study.across_seeds(runs)["skipped"]
