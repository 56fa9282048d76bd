"""The notebooks run top to bottom (on tiny settings) and are committed without outputs.

Each notebook's first code cell holds its size knobs (``GENERATIONS = 3`` ...); the test
rewrites them to the values in ``TINY`` and executes the notebook with nbclient in a
``python3`` kernel. The notebooks of one test process run one after another in one kernel,
each after ``%reset -f`` (its namespace starts empty, so a name it uses without defining
still fails): a kernel's start and its imports of jax, gymnax, metarl and matplotlib cost
about 6 CPU-seconds, and programs that notebooks 1, 2 and 4 share (the same value-distance
setting) are then traced once. What a user's fresh kernel has and this one may lack is
module state a notebook changes; none sets JAX or matplotlib options. The kernel also
shares the session's persistent JAX compilation cache (``tests/_subprocess_env.py``) with
the run of ``tests/test_plots.py`` (through the ``metarl`` command line), which uses the
same setting and devices, one JAX CPU device per core.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import nbformat
import pytest
from _subprocess_env import jax_cache_env

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))

# Knob values for the tests: those of TINY that a notebook defines, and every one of EXTRA's
# for that notebook.
TINY = {"GENERATIONS": 2, "POPULATION_SIZE": 2, "TOTAL_TIMESTEPS": 2048}
# 01, 02 and 04 run the main job's file with full generations (RUNGS = 1, as their default;
# successive halving would need 9 updates per agent, TINY's 2048 steps are 4): the program
# tests/test_plots.py and tests/test_trackers.py compile too.
EXTRA = {"01_quickstart.ipynb": {"RUNGS": 1},
         "02_value_distance.ipynb": {"EVAL_SEEDS": 2, "RUNGS": 1},
         # A drift heatmap costs CPU per cell of its grid to evaluate and draw (31 x 31
         # instead of 201 x 201: 2.5 s less).
         "03_lpo_drift.ipynb": {"GRID_POINTS": 31},
         "04_resume.ipynb": {"RESUME_TO": 3, "RUNGS": 1},
         # 1024 steps per agent (32 SAC updates, gradient steps from the 8th) still end one
         # 200-step Pendulum episode in each of the 4 environments, so every learning curve
         # has a point; 2048 spent 2.5 s more CPU on gradient steps.
         "05_sac_population.ipynb": {"TOTAL_TIMESTEPS": 1024},
         "06_pbt.ipynb": {"SEGMENTS": 2}, "07_policy_objectives.ipynb": {"GRID_POINTS": 31},
         # 08 trains only L2 of the baselines and reads the others from the shipped runs'
         # 16-seed evaluations: as many held-out seeds makes each run's comparisons paired,
         # as they are in the notebook's own setting. One PPO update per agent (4 envs x
         # 128 steps) keeps those 16 seeds cheap to train. It also means that no setting can
         # change a return (all are recorded in the rollout before the only update), so the
         # settings of a grid tie and tuning chooses the first. The grids start at the run's
         # own setting (vf_coef 0.5, learning rate x1): each tuned row is then the default
         # row, rather than a program compiled (about 5 s of CPU) to train the same returns
         # again; tests/test_tuning.py trains tuned settings.
         "08_is_my_discovery_real.ipynb": {
             "SEEDS": 16, "TUNE_SEEDS": 2, "BASELINES": ["l2"], "RUNS": 2,
             "TOTAL_TIMESTEPS": 512,
             "TUNE_GRID": {"vf_coef": [0.5, 1.0], "learning_rate": [1.0, 3.0]}},
         # 09 records the inputs of one PPO update per agent (2 agents x 4 epochs x 4
         # minibatches of 128 errors; a program with a host callback, which the persistent
         # cache does not keep) and fits 3 terms at most to 600 of them. It then trains the
         # network and its formula on 08's seeds and budget (16 seeds, one update each),
         # without L2 (each program traced costs about 3 CPU-s).
         "09_distill.ipynb": {"SEEDS": 16, "TOTAL_TIMESTEPS": 512, "RECORD_TIMESTEPS": 512,
                              "SAMPLES": 600, "MAX_COMPLEXITY": 3, "BASELINES": []},
         # 10 runs both engines on the PPO outlier bandit: 2 generations of 2 candidates and
         # 2 meta-gradient steps, with the notebook's lifetimes (2048 steps: the known-answer
         # tests' programs), then 2 held-out seeds per objective
         "10_engines.ipynb": {"META_STEPS": 2, "EVAL_SEEDS": 2}}

CELL_TIMEOUT = 420  # seconds per cell (the first compilation of a generation step)
NOTEBOOK_TIMEOUT = 600  # seconds per notebook, through pytest-timeout





def set_knobs(notebook, values: dict, optional=()) -> None:
    """Rewrite ``NAME = value`` lines of the first code cell; every name not in
    ``optional`` must be there, and at least one name must be."""
    cell = next(c for c in notebook.cells if c.cell_type == "code")
    source, found = cell.source, 0
    for name, value in values.items():
        pattern = re.compile(rf"^{name}\s*=.*?(?=\s*(#|$))", re.MULTILINE)
        source, count = pattern.subn(f"{name} = {value!r}", source)
        if count == 0 and name in optional:
            continue
        assert count == 1, f"the first code cell does not set {name} exactly once"
        found += 1
    assert found, "the first code cell sets none of the size knobs"
    cell.source = source


def test_notebooks_exist():
    names = [path.name for path in NOTEBOOKS]
    assert names == [
        "01_quickstart.ipynb", "02_value_distance.ipynb", "03_lpo_drift.ipynb",
        "04_resume.ipynb", "05_sac_population.ipynb", "06_pbt.ipynb",
        "07_policy_objectives.ipynb", "08_is_my_discovery_real.ipynb", "09_distill.ipynb",
        "10_engines.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {index} has outputs"
        assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"


def _render_module():
    spec = importlib.util.spec_from_file_location("render", NOTEBOOK_DIR / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_rendered_copy_in_docs_is_current(path):
    """docs/notebooks/ holds each notebook executed with its default knobs, figures
    included, made from the notebook as it is now."""
    render = _render_module()
    rendered = render.RENDERED / path.name
    again = f"run `python notebooks/render.py {path.stem}` and commit docs/notebooks/"
    assert rendered.is_file(), f"no rendered copy of {path.name}: {again}"
    notebook = nbformat.read(rendered, as_version=4)
    digest = notebook.metadata.get("metarl", {}).get("source")
    assert digest == render.source_digest(path), f"{path.name} changed since: {again}"
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure in the copy"


class SharedKernel:
    """One ``python3`` kernel for the notebooks of this process, started on first use and
    started again if a notebook killed it."""

    def __init__(self):
        self.manager = None

    def get(self):
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync

        if self.manager is not None and run_sync(self.manager.is_alive)():
            return self.manager
        try:
            KernelSpecManager().get_kernel_spec("python3")
        except NoSuchKernel:
            pytest.fail("no 'python3' Jupyter kernel: run `python -m ipykernel install --user`")
        self.manager = AsyncKernelManager(kernel_name="python3")
        run_sync(self.manager.start_kernel)(cwd=str(NOTEBOOK_DIR),
                                            env={**os.environ, **jax_cache_env()})
        return self.manager

    def shutdown(self):
        from jupyter_core.utils import run_sync

        if self.manager is not None:
            run_sync(self.manager.shutdown_kernel)(now=True)


@pytest.fixture(scope="module")
def kernel():
    shared = SharedKernel()
    yield shared
    shared.shutdown()


def fresh_start(tmp_path: Path) -> str:
    """The cell run before a notebook: an empty namespace, and temporary files (the
    notebooks' ``tempfile.mkdtemp()`` runs) under ``tmp_path``."""
    return ("%reset -f\n"
            "import os as _os, tempfile as _tempfile\n"
            f"_os.environ['TMPDIR'] = {str(tmp_path)!r}\n"
            "_tempfile.tempdir = None\n"
            "del _os, _tempfile")


@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, kernel):
    from nbclient import NotebookClient

    before = sorted(NOTEBOOK_DIR.rglob("*"))
    notebook = nbformat.read(path, as_version=4)
    extra = EXTRA.get(path.name, {})
    set_knobs(notebook, {**TINY, **extra}, optional=set(TINY) - set(extra))
    notebook.cells.insert(0, nbformat.v4.new_code_cell(fresh_start(tmp_path)))

    client = NotebookClient(
        notebook, km=kernel.get(), timeout=CELL_TIMEOUT, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        keep = os.environ.get("METARL_EXECUTED_NOTEBOOKS")  # to look at the outputs
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, Path(keep) / path.name)

    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} displayed no figure"
    created = sorted(set(NOTEBOOK_DIR.rglob("*")) - set(before))
    assert not created, f"the notebook wrote into the repository: {created}"
