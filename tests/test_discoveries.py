"""Discoveries taken out of their runs: the portable file, its refusals, ``metarl export``,
``metarl.load_objective`` and ``metarl evaluate`` of an exported file.

One tiny run directory (the evaluation tests' ``[inner]`` table, meta-parameters moved away
from their start so that the learned distance is not L2) is made per module; the LPO checks
read the run of ``docs/results/lpo_cpu``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _evaluation_run import write_run

import metarl
from inner_loops.objective import LossInputs
from metarl import cli, kinds
from metarl.discoveries import zoo
from metarl.discoveries.card import NO_EVALUATION
from metarl.discoveries.export import export_run
from metarl.discoveries.fileformat import (
    CARD_KEY,
    FORMAT_VERSION,
    DiscoveryFileError,
    flatten_tree,
    read_discovery,
)
from metarl.discoveries.load import bound_objective
from metarl.discoveries.materialise import cache_root, discovery_id, materialise
from metarl.objectives import lpo, make_objective
from metarl.objectives.value_distance import value_distance
from metarl.runs.layout import RunError
from metarl.runs.meta_params import (
    MEAN_FILE,
    load_meta_params,
    read_meta_params,
    save_meta_params,
)

ROOT = Path(__file__).resolve().parents[1]
LPO_RUN = ROOT / "docs" / "results" / "lpo_cpu"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A run directory of a value distance whose search mean is its start plus noise."""
    run_dir = write_run(tmp_path_factory.mktemp("discoveries") / "tiny")
    start = load_meta_params(run_dir / MEAN_FILE)
    leaves, treedef = jax.tree.flatten(start)
    keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
    moved = [leaf + 0.5 * jax.random.normal(key, np.shape(leaf))
             for leaf, key in zip(leaves, keys, strict=True)]
    save_meta_params(run_dir / MEAN_FILE, jax.tree.unflatten(treedef, moved))
    return run_dir


@pytest.fixture(scope="module")
def tiny_file(tiny_run, tmp_path_factory) -> Path:
    return export_run(tiny_run, out=tmp_path_factory.mktemp("file") / "tiny-mean.npz").path


def _rewrite(source: Path, target: Path, card=None, arrays=None) -> Path:
    """A copy of the discovery ``source`` with its card or arrays replaced, written by
    plain numpy (as a damaged or foreign file would be)."""
    with np.load(source, allow_pickle=False) as data:
        entries = {key: data[key] for key in data.files}
    if card is not None:
        entries[CARD_KEY] = np.asarray(card if isinstance(card, str) else json.dumps(card))
    if arrays is not None:
        entries.update(arrays)
    np.savez(target, **entries)
    return target


# --------------------------------------------------------------------------------------
# load_meta_params without a template


def test_load_meta_params_without_a_template_gives_lists_back(tmp_path):
    tree = {"value": {"layers": [{"w": np.ones((1, 2), np.float32)},
                                 {"w": np.full((2, 1), 2.0, np.float32)}]},
            "policy": {}, "other": {"0": np.zeros(1), "2": np.ones(1)}}
    save_meta_params(tmp_path / "m.msgpack", tree)
    loaded = load_meta_params(tmp_path / "m.msgpack")
    layers = loaded["value"]["layers"]
    assert isinstance(layers, list) and len(layers) == 2
    np.testing.assert_array_equal(layers[1]["w"], np.full((2, 1), 2.0))
    assert isinstance(loaded["other"], dict)  # keys not exactly "0".."n-1": a dict
    assert loaded["policy"] == {}


# --------------------------------------------------------------------------------------
# the file and its card


def test_export_round_trips_the_arrays_and_the_card(tiny_run, tiny_file):
    card, meta = read_discovery(tiny_file)
    objective = make_objective("value_distance", hidden_sizes=[8])
    expected = read_meta_params(tiny_run / MEAN_FILE, objective.init(jax.random.PRNGKey(0)))
    assert jax.tree.structure(meta) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(meta), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    assert card["format"] == "metarl.discovery" and card["format_version"] == FORMAT_VERSION
    assert card["objective"] == {"name": "value_distance", "options": {"hidden_sizes": [8]},
                                 "slots": ["value"]}
    assert card["candidate"] == "mean" and card["caveats"] == []
    assert card["found_under"]["experiment"] == json.loads(
        (tiny_run / "config.json").read_text())
    assert card["found_under"]["environments"] == ["CartPole-v1"]
    assert card["found_under"]["algorithms"] == ["ppo"]
    assert card["inputs"]["value"]["inputs"]["x"]["meaning"].startswith("x = value - target")
    assert [entry["path"] for entry in card["meta_params"]["tree"]] == [
        "value/layers/0/b", "value/layers/0/w", "value/layers/1/b", "value/layers/1/w"]
    # plain numpy reads it, with no pickle
    with np.load(tiny_file, allow_pickle=False) as data:
        assert json.loads(str(data[CARD_KEY])) == card
        np.testing.assert_array_equal(data["value/layers/0/w"],
                                      expected["value"]["layers"][0]["w"])


def test_a_run_never_evaluated_exports_and_says_so(tiny_run, tmp_path, capsys):
    out = tmp_path / "x.npz"
    assert cli.main(["export", str(tiny_run), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "was never evaluated" in captured.err
    assert f"wrote {out}" in captured.out and "objective value_distance" in captured.out
    card, _ = read_discovery(out)
    assert card["verdicts"] == {"evaluations": 0, "note": NO_EVALUATION, "comparisons": [],
                                "without_comparisons": []}


def test_export_never_overwrites_without_force(tiny_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", str(tiny_run)]) == 0
    default = tmp_path / "tiny_evaluation-mean.npz"  # ./<experiment name>-<which>.npz
    before = default.read_bytes()
    capsys.readouterr()
    assert cli.main(["export", str(tiny_run)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "metarl export: error: tiny_evaluation-mean.npz exists; pass --force to overwrite it"]
    assert default.read_bytes() == before
    assert cli.main(["export", str(tiny_run), "--force"]) == 0


def test_export_refuses_what_holds_no_discovery(tiny_run, tmp_path, capsys):
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "replicates.json").write_text(json.dumps(
        {"kind": "evolve", "replicates": ["seed_0"], "count": 1, "base_seed": 0,
         "config": json.loads((tiny_run / "config.json").read_text())}))
    pbt = tmp_path / "pbt"
    pbt.mkdir()
    (pbt / "config.json").write_text(json.dumps({"kind": "pbt", "name": "p"}))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_run / "config.json").read_text())
    wanted = {parent: "is a parent of replicated runs", pbt: "is a pbt run",
              bare: "has no mean_meta_params.msgpack"}
    for run_dir, message in wanted.items():
        assert cli.main(["export", str(run_dir), "-o", str(tmp_path / "o.npz")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "o.npz").exists()


def test_damaged_foreign_and_newer_files_are_refused_each_with_its_reason(tiny_file,
                                                                          tmp_path):
    card, _ = read_discovery(tiny_file)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(tiny_file.read_bytes()[:300])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.ones(3))
    newer = _rewrite(tiny_file, tmp_path / "newer.npz",
                     card={**card, "format_version": FORMAT_VERSION + 1})
    not_json = _rewrite(tiny_file, tmp_path / "not_json.npz", card="{not json")
    lacking = _rewrite(tiny_file, tmp_path / "lacking.npz",
                       card={key: value for key, value in card.items() if key != "objective"})
    weights = flatten_tree(read_discovery(tiny_file)[1])
    changed = _rewrite(tiny_file, tmp_path / "changed.npz",
                       arrays={"value/layers/0/w": weights["value/layers/0/w"] + 1.0})
    reshaped = _rewrite(tiny_file, tmp_path / "reshaped.npz",
                        arrays={"value/layers/0/w": weights["value/layers/0/w"].T})
    wanted = {truncated: "is damaged or not a discovery file",
              foreign: "is not a metarl discovery: the npz has no '__card__' entry",
              newer: f"was written by a newer metarl (discovery format version "
                     f"{FORMAT_VERSION + 1}; this metarl reads up to {FORMAT_VERSION}); "
                     "upgrade metarl",
              not_json: "is damaged: its card is not valid JSON",
              lacking: "is damaged: its card lacks objective",
              changed: "is damaged: the checksum of its arrays does not match",
              reshaped: "is damaged: its arrays do not match the card's tree"}
    for path, message in wanted.items():
        with pytest.raises(DiscoveryFileError) as error:
            read_discovery(path)
        assert message in str(error.value), path.name
        assert isinstance(error.value, ValueError)
        with pytest.raises(DiscoveryFileError):
            metarl.load_objective(path)


# --------------------------------------------------------------------------------------
# load_objective


def test_the_loaded_distance_is_metarls_own(tiny_run, tiny_file):
    objective = make_objective("value_distance", hidden_sizes=[8])
    meta = read_meta_params(tiny_run / MEAN_FILE, objective.init(jax.random.PRNGKey(0)))
    x = jnp.linspace(-4.0, 4.0, 33).reshape(3, 11)
    own = value_distance(meta["value"], x, "scaled_l2")
    assert not np.allclose(own, 0.5 * x ** 2, rtol=1e-2)  # moved away from L2
    for source in (tiny_run, tiny_file):
        found = metarl.load_objective(source)
        np.testing.assert_array_equal(found.value(x), own)
        assert found.policy is None and found.optimizer is None
        assert found.slots == ("value",) and found.name == "value_distance"
        inputs = LossInputs(values=x[0], targets=jnp.zeros(11))
        np.testing.assert_array_equal(found.loss("value")(inputs),
                                      objective.value_loss(meta, inputs))
    with pytest.raises(ValueError, match="does not fill the policy slot"):
        found.loss("policy")
    with pytest.raises(ValueError, match="holds the mean candidate, not 'best'"):
        metarl.load_objective(tiny_file, which="best")


def test_the_loaded_lpo_drift_is_the_drift_of_metarls_lpo_loss():
    found = metarl.load_objective(LPO_RUN)
    config = json.loads((LPO_RUN / "config.json").read_text())
    options = config["objective"]["options"]
    assert options["ppo_init"] is True  # so the bound clip_eps matters
    ratio = jnp.exp(jax.random.normal(jax.random.PRNGKey(0), (64,)) * 0.3)
    advantage = jax.random.normal(jax.random.PRNGKey(1), (64,))
    drift = found.policy(ratio, advantage)
    np.testing.assert_array_equal(drift, lpo.drift(found.meta_params["policy"], ratio,
                                                   advantage, 0.2, ppo_init=True))
    objective = make_objective("lpo", **options)
    inputs = LossInputs(ratio=ratio, log_ratio=jnp.log(ratio), advantages=advantage,
                        clip_eps=jnp.float32(config["inner"][0]["clip_eps"]),
                        progress=jnp.float32(0.3))
    loss = objective.policy_loss(found.meta_params, inputs)
    np.testing.assert_allclose(loss, -jnp.mean(ratio * advantage - drift), rtol=1e-6)
    np.testing.assert_array_equal(found.loss("policy")(inputs), loss)


def test_every_function_jits_vmaps_and_differentiates():
    value = metarl.load_objective("zoo:value_distance_blog").value
    x = jnp.linspace(-3.0, 3.0, 13)
    np.testing.assert_allclose(jax.jit(value)(x), value(x), rtol=1e-5, atol=1e-6)
    # transformations composed under one jit: op-by-op dispatch would compile every op
    np.testing.assert_allclose(jax.jit(jax.vmap(value))(x), value(x), rtol=1e-5, atol=1e-6)
    slope = jax.jit(jax.vmap(jax.grad(value)))(x)
    step = 1e-2
    central = (value(x + step) - value(x - step)) / (2 * step)
    np.testing.assert_allclose(slope, central, rtol=2e-2, atol=2e-2)

    ratio, advantage = jnp.array([0.7, 0.95, 1.0, 1.1, 1.4]), jnp.array([1.0, -2.0, 0.5,
                                                                         2.0, -1.0])
    for name, extra in (("lpo_cpu", ()), ("ta_lpo_cpu", (jnp.float32(0.5),))):
        drift = metarl.load_objective(f"zoo:{name}").policy
        eager = drift(ratio, advantage, *extra)
        assert eager[2] == 0.0 and bool(jnp.all(eager >= 0))
        np.testing.assert_allclose(jax.jit(drift)(ratio, advantage, *extra), eager,
                                   rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(jax.jit(jax.vmap(
            lambda r, a, d=drift, e=extra: d(r, a, *e)))(ratio, advantage), eager,
            rtol=1e-5, atol=1e-7)
        grad = jax.jit(jax.grad(lambda r, d=drift, e=extra: d(r, advantage, *e).sum()))(
            ratio)
        assert grad[2] == 0.0 and bool(jnp.all(jnp.isfinite(grad)))
    ta_lpo = metarl.load_objective("zoo:ta_lpo_cpu").policy
    early, late = ta_lpo(ratio, advantage, 0.0), ta_lpo(ratio, advantage, 0.9)
    assert not np.allclose(early, late)  # progress is an input

    rule = metarl.load_objective("zoo:learned_optimizer_cpu").optimizer
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    grads = {"w": jnp.full((3, 2), 0.1), "b": jnp.array([0.2, -0.3])}
    state = rule.init(params)

    def step_of(g, progress):
        updates, _ = rule.update(g, state, params, progress=progress,
                                 key=jax.random.PRNGKey(0))
        return updates

    # (eager updates equal metarl's own: test_the_loaded_optimizer_is_the_rule_ppo_builds)
    jitted = jax.jit(step_of)(grads, 0.5)
    batched = jax.jit(jax.vmap(step_of, in_axes=(None, 0)))(grads, jnp.array([0.0, 0.5]))
    for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(batched["w"][0], batched["w"][1])  # progress is an input
    slope = jax.jit(jax.grad(
        lambda g: sum(jnp.sum(u) for u in jax.tree.leaves(step_of(g, 0.5)))))(grads)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(slope))
    with pytest.raises(ValueError, match="needs the extra argument progress"):
        rule.update(grads, state, params)


def _moved(objective, seed: int):
    """The objective's initial meta-parameters plus noise, so no function is its start."""
    start = objective.init(jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree.flatten(start)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), max(len(leaves), 1))
    return jax.tree.unflatten(treedef, [leaf + 0.3 * jax.random.normal(key, leaf.shape)
                                        for leaf, key in zip(leaves, keys, strict=False)])


@pytest.mark.parametrize("name, options", [
    ("value_distance", {"hidden_sizes": [4], "learn_scale": True}),
    ("value_distance", {"hidden_sizes": [4], "form": "even_scaled_l2"}),
    ("l2", {}), ("huber", {}),
    ("lpo", {"hidden_sizes": [4], "ppo_init": True}),
    ("ta_lpo", {"hidden_sizes": [4]}),
    ("dpo", {"alpha": 1.5}),
])
def test_each_portable_function_is_what_the_objectives_loss_averages(name, options):
    """value: loss = mean(d(x)); policy: loss = -mean(r A - drift(r, A[, p])), with
    clip_eps bound from the card's [inner] table (0.1 here, not the default 0.2)."""
    objective = make_objective(name, **options)
    meta = _moved(objective, 5)
    card = {"objective": {"name": name, "options": options},
            "found_under": {"experiment": {"inner": [{"clip_eps": 0.1}]}}}
    found = bound_objective(card, meta)
    ratio = jnp.exp(0.4 * jax.random.normal(jax.random.PRNGKey(7), (32,)))
    advantage = jax.random.normal(jax.random.PRNGKey(8), (32,))
    inputs = LossInputs(ratio=ratio, log_ratio=jnp.log(ratio), advantages=advantage,
                        values=3 * advantage, targets=ratio, clip_eps=jnp.float32(0.1),
                        progress=jnp.float32(0.6))
    if found.value is not None:
        own = objective.value_loss(meta, inputs)
        np.testing.assert_allclose(jnp.mean(found.value(inputs.values - inputs.targets)), own,
                                   rtol=1e-5)
    if found.policy is not None:
        extra = (inputs.progress,) if name == "ta_lpo" else ()
        drift = found.policy(ratio, advantage, *extra)
        own = objective.policy_loss(meta, inputs)
        np.testing.assert_allclose(-jnp.mean(ratio * advantage - drift), own, rtol=1e-5,
                                   atol=1e-7)


@pytest.mark.parametrize("name", ["learned_optimizer", "open_optimizer"])
def test_the_loaded_optimizer_is_the_rule_ppo_builds(name):
    objective = make_objective(name, hidden_sizes=[4])
    meta = _moved(objective, 9)
    found = bound_objective({"objective": {"name": name, "options": {"hidden_sizes": [4]}}},
                            meta)
    own = objective.optimizer_transformation(meta)
    params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
    grads = jax.tree.map(lambda leaf: 0.1 * jnp.arange(leaf.size, dtype=jnp.float32)
                         .reshape(leaf.shape) - 0.2, params)
    key = jax.random.PRNGKey(4)
    ours, _ = found.optimizer.update(grads, found.optimizer.init(params), params,
                                     progress=0.25, key=key)
    theirs, _ = own.update(grads, own.init(params), params, progress=0.25, key=key)
    for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(got, want)
    adam, _ = optax.scale_by_adam(eps=1e-5).update(grads, optax.scale_by_adam(
        eps=1e-5).init(params), params)
    assert not np.allclose(ours["dense"]["kernel"], adam["dense"]["kernel"])  # not its start
    with pytest.raises(ValueError, match="update rule, not a loss"):
        found.loss("optimizer")


def test_importing_metarl_stays_cheap():
    code = ("import sys, metarl; before = 'metarl.discoveries' in sys.modules or "
            "'metarl.objectives' in sys.modules; f = metarl.load_objective; "
            "print(before, 'metarl.discoveries.load' in sys.modules, f.__name__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True", "load_objective"]


# --------------------------------------------------------------------------------------
# evaluate of an exported file


def test_a_discovery_materialises_once_under_the_cache(tiny_file, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache" / "metarl" / "discoveries"
    run_dir, card = materialise(tiny_file)
    assert run_dir == cache_root() / discovery_id(card)
    assert json.loads((run_dir / "config.json").read_text()) == \
        card["found_under"]["experiment"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "exported"
    (run_dir / "evaluations").mkdir()
    assert materialise(tiny_file) == (run_dir, card)  # found again, kept as it is
    assert (run_dir / "evaluations").is_dir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(RunError, match="already holds something else"):
        materialise(tiny_file, other)


@pytest.mark.parametrize("name", ["lpo_cpu", "minigrid_drift", "learned_optimizer_cpu"])
def test_a_zoo_entry_materialises_as_a_run_evaluation_reads(name, tmp_path):
    """What `metarl evaluate zoo:NAME` starts from: the experiment validates today and the
    meta-parameters fit its objective (the drift's distilled formulas come along)."""
    run_dir, card = materialise(f"zoo:{name}", tmp_path / name)
    config = kinds.read_config(run_dir)
    assert config.objective.name == card["objective"]["name"]
    template = config.objective.build().init(jax.random.PRNGKey(0))
    meta = read_meta_params(run_dir / MEAN_FILE, template)
    for got, want in zip(jax.tree.leaves(meta),
                         jax.tree.leaves(metarl.load_objective(f"zoo:{name}").meta_params),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    assert (run_dir / "distill.json").is_file() == bool(card["distilled"])
    assert kinds.run_kind(run_dir) == "evolve"


def test_evaluate_an_exported_file(tiny_file, tmp_path, capsys):
    into = tmp_path / "evaluated"
    argv = ["evaluate", str(tiny_file), "--run-dir", str(into), "--seeds", "2",
            "--baselines", "l2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"evaluated as the run directory {into}" in out
    record = json.loads((into / "evaluations" / "1.json").read_text())
    assert record["objective"] == "value_distance" and record["seeds"] == 2
    assert {row["objective"] for row in record["results"]} == {"evolved", "l2"}
    assert [c["baseline"] for c in record["statistics"]["environments"]["CartPole-v1"]
            ["comparisons"]] == ["l2"]
    assert cli.main(argv) == 0  # the same evaluation of the same folder: reused
    assert "reusing" in capsys.readouterr().out


def test_evaluate_refuses_an_unknown_zoo_name_in_one_line(capsys):
    assert cli.main(["evaluate", "zoo:nothing"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "unknown zoo entry 'nothing'; the zoo has: " \
        "value_distance_blog" in lines[0]


PLUGIN = '''
from metarl.objectives import make_objective
from metarl.objectives.registry import register_objective


@register_objective("card_module_distance", slots=("value",))
def make_card_module_distance(**options):
    """The value distance under another name, registered by a module of the user's."""
    return make_objective("value_distance", **options)
'''


def test_a_card_naming_a_module_imports_it_and_a_file_source_is_asked_for(tmp_path,
                                                                          monkeypatch):
    card, meta_params = read_discovery(zoo.entry_path("value_distance_blog"))
    card = json.loads(json.dumps(card))
    card["objective"].update(name="card_module_distance", module="card_module_plugin")
    (tmp_path / "card_module_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = bound_objective(card, meta_params)  # imports card_module_plugin by its name
    assert loaded.name == "card_module_distance"
    x = jnp.linspace(-3.0, 3.0, 7)
    inputs = LossInputs(values=x, targets=jnp.zeros_like(x))
    expected = jnp.mean(value_distance(loaded.meta_params["value"], x))
    np.testing.assert_allclose(loaded.loss("value")(inputs), expected, rtol=1e-6)

    card["objective"].update(name="defined_in_a_file", module="objective_source/mine.py")
    with pytest.raises(ValueError, match="'objective_source/mine.py'.*import that file first"):
        bound_objective(card, meta_params)
    card["objective"].update(module="no_such_module_anywhere")
    with pytest.raises(ValueError, match="no_such_module_anywhere.*PYTHONPATH"):
        bound_objective(card, meta_params)
