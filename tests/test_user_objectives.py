"""A researcher's own objective, defined outside the package, in every command and process.

One tiny run of an objective written to a temporary folder (``[objective] module =
"user_weighted.py"``, the folder not on ``PYTHONPATH``) is started, resumed, evaluated,
plotted and distilled, each by ``python -m metarl`` in a process of its own, after the
original file is gone: every command reads the copy the run keeps in
``objective_source/``. The same run, packed and unpacked elsewhere with that copy renamed,
gives one line and exit 2 from each command. A second run names the objective by module
name with its folder on ``PYTHONPATH``. Installed plugins (entry points) and the checks of
``[objective] options`` at load run in this process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import pytest
from _subprocess_env import env_without_device_count, jax_cache_env
from _tiny_evolution import GENERATIONS, TINY

from metarl.config import ConfigError
from metarl.evolve.config import ObjectiveConfig
from metarl.kinds import load_experiment, plot, read_config
from metarl.objectives import make_objective
from metarl.objectives.sources import reload_entry_points
from metarl.runs.archive import pack_run, unpack_run

OBJECTIVE = "user_weighted_l2"

# A learned value loss on the pattern of metarl/objectives/value_distance.py: L2 weighted by
# exp(scale * tanh(MLP(x))) of the error x, starting at L2 (the last layer is zero).
USER_MODULE = textwrap.dedent(f'''
    """A user's learned value loss, registered as {OBJECTIVE!r}."""
    from collections.abc import Sequence

    import jax.numpy as jnp

    from inner_loops.objective import LossTerm, Objective
    from metarl.objectives.mlp import apply_mlp, init_mlp
    from metarl.objectives.registry import register_objective


    def weight(params, x, scale=1.0):
        return jnp.exp(scale * jnp.tanh(apply_mlp(params, x[..., None])[..., 0]))


    def figures(request):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        x = jnp.linspace(-3.0, 3.0, 61)
        for which, params in request.candidates.items():
            ax.plot(x, weight(params["value"], x), label=request.label(which))
        ax.legend()
        return {{"user_weight": fig}}


    @register_objective({OBJECTIVE!r}, slots=("value",), baselines=("l2",), plot=figures)
    def make_user_weighted(hidden_sizes: Sequence[int] = (8,), scale: float = 1.0) -> Objective:
        """L2 of the value error weighted by a learned exp(scale tanh(MLP(x)))."""
        sizes = (1, *(int(h) for h in hidden_sizes), 1)

        def init(key):
            return init_mlp(key, sizes, use_bias=True, zero_last=True)

        def loss(params, inputs):
            x = inputs.values - inputs.targets
            return 0.5 * jnp.mean(jnp.square(x) * weight(params, x, scale))

        return Objective(value=LossTerm({OBJECTIVE!r}, init, loss))
''')

def experiment_text(name: str, module: str) -> str:
    """The run-directory tests' tiny experiment with the objective ``name`` of ``module``,
    for two generations."""
    objective = 'name = "value_distance"'
    assert objective in TINY and f"generations = {GENERATIONS}" in TINY
    return (TINY.replace(objective, f'name = "{name}"\nmodule = "{module}"')
            .replace(f"generations = {GENERATIONS}", "generations = 2"))


def metarl(*args, pythonpath: Path | None = None, timeout: float = 400
           ) -> subprocess.CompletedProcess:
    """``python -m metarl --cpu-devices 1 ARGS`` in a process of its own (the session's
    compilation cache shared), its test folder off ``PYTHONPATH`` unless given."""
    extra = {"PYTHONPATH": str(pythonpath)} if pythonpath is not None else {}
    env = env_without_device_count(**jax_cache_env(), **extra)
    if pythonpath is None:
        env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "metarl", "--cpu-devices", "1",
                           *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The command's error: exit 2 and one line on stderr (no traceback)."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def write_experiment(folder: Path, module: str, name: str = OBJECTIVE) -> Path:
    path = folder / "experiment.toml"
    path.write_text(experiment_text(name, module))
    return path


@pytest.fixture(scope="module")
def file_run(tmp_path_factory):
    """A 2-generation run of the objective named by ``.py`` path, its source folder removed
    afterwards: ``(run directory, sha256 of the file, the run's output)``."""
    source = tmp_path_factory.mktemp("elsewhere")
    (source / "user_weighted.py").write_text(USER_MODULE)
    sha256 = hashlib.sha256((source / "user_weighted.py").read_bytes()).hexdigest()
    run_dir = tmp_path_factory.mktemp("runs") / "user"
    done = metarl("run", write_experiment(source, "user_weighted.py"), "--run-dir", run_dir,
                  "--no-plots")
    assert done.returncode == 0, done.stderr
    shutil.rmtree(source)  # from here on only the run's copy exists
    return run_dir, sha256, done


def test_the_run_keeps_a_copy_of_the_file_and_records_it(file_run):
    run_dir, sha256, _ = file_run
    saved = json.loads((run_dir / "config.json").read_text())["objective"]
    assert saved["module"] == "objective_source/user_weighted.py"
    assert saved["sha256"] == sha256
    assert "base_dir" not in saved
    copy = run_dir / "objective_source" / "user_weighted.py"
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == sha256


def test_every_command_finds_the_objective_in_a_new_process(file_run, tmp_path):
    """resume, evaluate, plot in processes of their own, the original file gone; distill
    says in one line that it cannot apply."""
    run_dir = shutil.copytree(file_run[0], tmp_path / "user")
    resumed = metarl("resume", run_dir, "--generations", 3, "--no-plots")
    assert resumed.returncode == 0, resumed.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["generation"] for line in metrics if "generation" in line] == [1, 2, 3]

    evaluated = metarl("evaluate", run_dir, "--seeds", 2, "--baselines", "l2")
    assert evaluated.returncode == 0, evaluated.stderr
    record = json.loads(next((run_dir / "evaluations").glob("*.json")).read_text())
    assert record["objective"] == OBJECTIVE

    plotted = metarl("plot", run_dir)
    assert plotted.returncode == 0, plotted.stderr
    assert (run_dir / "plots" / "user_weight.png").is_file()

    line = one_line_error(metarl("distill", run_dir))
    assert f"objective {OBJECTIVE!r} has no evolved function to distil" in line


def test_a_packed_run_carries_its_objective_and_a_missing_one_is_one_line(file_run,
                                                                          tmp_path):
    archive = pack_run(file_run[0], tmp_path / "user.tar.gz")
    with tarfile.open(archive) as tar:
        assert "user/objective_source/user_weighted.py" in tar.getnames()
    run_dir = unpack_run(archive, tmp_path / "machine_b")
    copy = run_dir / "objective_source" / "user_weighted.py"
    copy.rename(copy.with_name("renamed.py"))
    for command in (["resume", run_dir, "--generations", 3], ["evaluate", run_dir],
                    ["plot", run_dir]):
        line = one_line_error(metarl(*command))
        assert f"metarl {command[0]}: error: objective: cannot load objective " \
               f"{OBJECTIVE!r}: file {copy} not found" in line
        assert "restore that file" in line and "[objective] module" in line


def test_a_module_name_on_pythonpath_is_recorded_by_name(tmp_path, monkeypatch):
    """Started in a process with the module's folder on PYTHONPATH, the run is read back
    in this one: refused in one line while the folder is not on ``sys.path``, then
    plotted once it is."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "user_weighted_mod.py").write_text(USER_MODULE)
    run_dir = tmp_path / "by_name"
    started = metarl("run", write_experiment(folder, "user_weighted_mod"), "--run-dir",
                     run_dir, "--set", "es.generations=1", "--no-plots", pythonpath=folder)
    assert started.returncode == 0, started.stderr
    saved = json.loads((run_dir / "config.json").read_text())["objective"]
    assert saved["module"] == "user_weighted_mod" and "sha256" not in saved
    assert not (run_dir / "objective_source").exists()

    with pytest.raises(ConfigError) as error:
        read_config(run_dir)
    assert (f"objective: cannot load objective {OBJECTIVE!r}: importing module "
            "'user_weighted_mod' failed (ModuleNotFoundError") in str(error.value)
    assert "PYTHONPATH" in str(error.value) and "\n" not in str(error.value)

    monkeypatch.syspath_prepend(str(folder))
    assert read_config(run_dir).objective.module == "user_weighted_mod"
    assert run_dir / "plots" / "user_weight.png" in plot(run_dir)


def test_an_installed_plugin_registers_its_objective(tmp_path, monkeypatch):
    """A distribution's entry point in the group ``metarl.objectives`` is loaded when its
    name is first looked up; a broken one is one warning naming it."""
    (tmp_path / "plugin_objectives.py").write_text(
        USER_MODULE.replace(repr(OBJECTIVE), repr("plugin_weighted_l2")))
    info = tmp_path / "metarl_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: metarl-plugin-demo\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[metarl.objectives]\n"
                                           "weighted = plugin_objectives\n"
                                           "broken = no_such_module_for_metarl_tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reload_entry_points()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            objective = make_objective("plugin_weighted_l2", hidden_sizes=(4,))
        assert objective.label == "plugin_weighted_l2" and objective.slots == ("value",)
        messages = [str(w.message) for w in caught]
        assert len(messages) == 1 and "objective plugin 'broken'" in messages[0], messages
        assert "metarl-plugin-demo" in messages[0]
    finally:
        reload_entry_points()


@pytest.mark.parametrize(("override", "message"), [
    ("objective.options.hidden_size=[8]",
     "objective.options.hidden_size: not an option of objective 'value_distance'; "
     "accepted: form, hidden_sizes, learn_scale"),
    ("objective.options.hidden_sizes=[8.5]",
     "objective.options.hidden_sizes: objective 'value_distance' expects a list of "
     "integers, got [8.5]"),
    ("objective.options.learn_scale=1",
     "objective.options.learn_scale: objective 'value_distance' expects true or false"),
])
def test_options_are_checked_when_the_experiment_loads(override, message):
    with pytest.raises(ConfigError) as error:
        load_experiment("value_distance_cartpole", [override])
    assert message in str(error.value)


def test_a_user_objectives_options_are_checked_and_a_valid_override_loads(tmp_path):
    (tmp_path / "user_weighted_opts.py").write_text(
        USER_MODULE.replace(repr(OBJECTIVE), repr("user_weighted_opts")))
    path = write_experiment(tmp_path, "user_weighted_opts.py", name="user_weighted_opts")
    with pytest.raises(ConfigError, match=r"objective\.options\.scale: objective "
                                          r"'user_weighted_opts' expects a number, got 'big'"):
        load_experiment(path, ["objective.options.scale='big'"])
    config = load_experiment(path, ["objective.options.scale=0.5",
                                    "objective.options.hidden_sizes=[4, 4]"])
    assert config.objective.options == {"hidden_sizes": [4, 4], "scale": 0.5}
    assert config.objective.base_dir == str(tmp_path.absolute())
    with pytest.raises(ConfigError, match="unknown objective 'user_weighted_nope' .*its file "
                                          ".* was imported but registers no objective"):
        load_experiment(path, ["objective.name='user_weighted_nope'"])


def test_a_recorded_file_that_changed_is_used_with_a_warning(tmp_path):
    (tmp_path / "user_weighted_sha.py").write_text(
        USER_MODULE.replace(repr(OBJECTIVE), repr("user_weighted_sha")))
    recorded = "0" * 64  # the run recorded another content
    with pytest.warns(UserWarning, match=r"user_weighted_sha\.py has changed since it was "
                                         r"recorded \(sha256 000000000000\.\.\., now "):
        config = ObjectiveConfig(name="user_weighted_sha", module="user_weighted_sha.py",
                                 sha256=recorded, base_dir=str(tmp_path))
    assert config.sha256 == recorded and config.build().label == "user_weighted_sha"
