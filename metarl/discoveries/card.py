"""A discovery taken out of its run directory: the candidate's meta-parameters and the card
that travels with them (:mod:`metarl.discoveries.fileformat`).

:func:`discovery_of` reads an evolution run directory (its ``config.json``, the candidate's
meta-parameters file, ``status.json``, ``metrics.jsonl``, every ``evaluations/<n>.json`` and
``distill.json``) and returns ``(meta_params, card)``; nothing is written. The card holds:

* ``objective``: registered ``name``, ``options``, ``slots``, and ``module`` where the
  experiment's ``[objective]`` names the module that registers a user objective (its
  source is never copied);
* ``candidate`` (``mean`` or ``best``), ``generation`` (the generations done when it was
  taken) and ``source`` (the run directory's name and the meta-parameters file's sha256);
* ``inputs``: each slot's input contract (:mod:`metarl.discoveries.contracts`);
* ``found_under``: the whole experiment (``config.json``), the algorithms, environments and
  held-out ones, the search's size and its agent-steps, each number with where it comes
  from;
* ``verdicts``: every comparison of every evaluation record (computed from its returns for
  a record older than saved statistics, as ``metarl evaluate``'s table does), or a note
  that there is none;
* ``distilled``: the candidate's entry of ``distill.json`` (its closed-form formulas), or
  ``None``;
* ``caveats``: a list of strings, empty unless the caller gives some (the zoo does).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from metarl.config import ConfigError
from metarl.discoveries.contracts import slot_contracts
from metarl.evolve.distill import DISTILL_FILE
from metarl.evolve.evaluate import environment_statistics
from metarl.kinds import EVOLVE, is_parent, kind_spec, run_kind
from metarl.runs.evaluations import list_records
from metarl.runs.layout import CONFIG_FILE, RunError, now, read_json, read_metrics, read_status
from metarl.runs.meta_params import CANDIDATE_FILES, meta_params_sha256, read_meta_params

NO_EVALUATION = ("no evaluation: the run was never evaluated, so nothing says how it "
                 "compares with a baseline (metarl evaluate RUN_DIR judges it)")
NO_RESULTS = "this record has neither statistics nor results to judge"
COMPUTED = ("computed from the record's returns: it was written before evaluations saved "
            "their statistics (as metarl evaluate's table computes them)")
TUNED_SUFFIX = " (tuned)"


def discovery_of(run_dir: str | Path, which: str = "mean",
                 caveats: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]:
    """``(meta_params, card)`` of the ``which`` candidate of the evolution run ``run_dir``:
    float32 arrays in the objective's structure, and the card of the module docstring
    (``format`` fields and the arrays' tree are added when written).

    Raises:
        RunError: ``run_dir`` is not a run, is a parent of replicated runs, is a run of
            another kind than evolution, or lacks the candidate's meta-parameters file.
        ConfigError: ``which`` is not ``mean`` or ``best``.
    """
    if which not in CANDIDATE_FILES:
        raise ConfigError(f"which: got {which!r}; allowed: {', '.join(CANDIDATE_FILES)}")
    run_dir = Path(run_dir)
    kind = run_kind(run_dir)
    if is_parent(run_dir):
        raise RunError(f"{run_dir} is a parent of replicated runs; export one of its seeds "
                       f"({run_dir}/seed_0, ...)")
    if kind != EVOLVE:
        raise RunError(f"{run_dir} is a {kind} run; only evolution runs hold a discovered "
                       "objective to export")
    meta_path = run_dir / CANDIDATE_FILES[which]
    if not meta_path.is_file():
        raise RunError(f"{run_dir} has no {meta_path.name} (no {which} candidate saved yet)")
    config = kind_spec(EVOLVE).read_config(run_dir)
    data = read_json(run_dir / CONFIG_FILE)
    objective = config.objective.build()
    import jax  # the template's structure only

    meta_params = read_meta_params(meta_path, objective.init(jax.random.PRNGKey(0)))
    meta_sha = meta_params_sha256(meta_path)
    generation, generation_source = _generations_done(run_dir)
    table = data["objective"]
    card = {
        "metarl_version": _version("metarl"),
        "jax_version": _version("jax"),
        "created": now(),
        "name": data.get("name", run_dir.name),
        "description": data.get("description", ""),
        "objective": {"name": table["name"], "options": dict(table.get("options", {})),
                      "slots": list(objective.slots),
                      **({"module": table["module"]} if "module" in table else {})},
        "candidate": which,
        "generation": generation,
        "source": {"run_dir": run_dir.name, "meta_params_file": meta_path.name,
                   "meta_params_file_sha256": meta_sha},
        "inputs": slot_contracts(table["name"], objective.slots, data["inner"][0]),
        "found_under": found_under(run_dir, data, generation, generation_source),
        "verdicts": verdicts(run_dir, meta_sha),
        "distilled": _distilled(run_dir, which),
        "caveats": [str(caveat) for caveat in caveats],
    }
    return meta_params, card


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _generations_done(run_dir: Path) -> tuple[int | None, str]:
    """The generations the run finished, and where the number comes from."""
    status = read_status(run_dir)
    if isinstance(status.get("generation"), int):
        return status["generation"], "status.json: generation"
    try:
        last = read_metrics(run_dir)[-1]
        return int(last["generation"]), "metrics.jsonl: generation of the last line"
    except (RunError, IndexError, KeyError, TypeError, ValueError):
        return None, "unknown: the run has neither status.json nor metrics.jsonl"


def found_under(run_dir: Path, data: Mapping[str, Any], generation: int | None,
                generation_source: str) -> dict[str, Any]:
    """What the discovery was found under: the experiment, its algorithms and tasks, the
    search's size and its agent-steps, each count with its source."""
    inner, held_out = list(data["inner"]), list(data.get("held_out") or [])
    es, fitness = data.get("es", {}), data.get("fitness", {})
    try:
        last = read_metrics(run_dir)[-1]
    except (RunError, IndexError):
        last = {}
    steps = last.get("agent_steps")
    return {
        "experiment": dict(data),
        "algorithms": sorted({table.get("algorithm", "ppo") for table in inner}),
        "environments": [_task_label(table) for table in inner],
        "held_out_environments": [_task_label(table) for table in held_out],
        "search": {
            "method": (data.get("meta") or {}).get("method", "evolution"),
            "strategy": es.get("strategy"),
            "population_size": es.get("population_size"),
            "seeds_per_candidate": fitness.get("seeds_per_candidate"),
            "tasks_per_generation": fitness.get("tasks_per_generation"),
            "evolution_seeds": es.get("evolution_seeds", 1),
            "generations_done": generation,
            "generations_done_source": generation_source,
            "generations_budget": es.get("generations"),
        },
        "agent_steps": steps,
        "agent_steps_source": (
            f"metrics.jsonl: agent_steps of the last line (generation "
            f"{last.get('generation')}), the environment steps of every agent the search "
            "trained, summed over its generations" if steps is not None
            else "unknown: metrics.jsonl has no agent_steps"),
    }


def _task_label(table: Mapping[str, Any]) -> str:
    return str(table.get("label") or table.get("env_id"))


def verdicts(run_dir: Path, meta_sha: str) -> dict[str, Any]:
    """Every comparison of every evaluation record of ``run_dir``, oldest record first;
    ``same_meta_params`` says whether the record evaluated exactly the exported file."""
    records = list_records(run_dir)
    comparisons, without = [], []
    for record in records:
        name = (f"evaluations/{record['id']}.json" if isinstance(record["id"], int)
                else Path(record["path"]).name)
        spec = record.get("spec") or {}
        statistics, source = record.get("statistics"), "saved in the record"
        if not statistics and record.get("results"):
            statistics, source = environment_statistics(record["results"]), COMPUTED
        environments = (statistics or {}).get("environments") or {}
        if not environments:
            without.append({"evaluation": name, "environments": spec.get("environments"),
                            "note": NO_RESULTS})
            continue
        tuning = (record.get("tuning") or {}).get("environments") or {}
        held_out = set(record.get("held_out_tasks") or [])
        for environment, table in environments.items():
            for comparison in table.get("comparisons", []):
                comparisons.append({**_comparison(name, record, spec, environment,
                                                  comparison, tuning.get(environment) or {},
                                                  environment in held_out, meta_sha),
                                    "statistics": source})
    if not records:
        return {"evaluations": 0, "note": NO_EVALUATION, "comparisons": [],
                "without_comparisons": []}
    return {"evaluations": len(records), "note": None, "comparisons": comparisons,
            "without_comparisons": without}


def _comparison(name: str, record: Mapping[str, Any], spec: Mapping[str, Any],
                environment: str, comparison: Mapping[str, Any],
                tuning: Mapping[str, Any], held_out: bool, meta_sha: str) -> dict[str, Any]:
    evolved, baseline = comparison.get("evolved"), comparison.get("baseline")
    tuned = str(evolved).endswith(TUNED_SUFFIX)
    entry = {
        "evaluation": name,
        "created": record.get("created"),
        "environment": environment,
        "held_out_task": held_out,
        "candidate": record.get("meta_params"),
        "generation": record.get("meta_params_generation"),
        "same_meta_params": (spec.get("meta_params_sha256") == meta_sha
                             if "meta_params_sha256" in spec else None),
        "evolved": evolved,
        "baseline": baseline,
        "tuned": tuned,
        "seeds": record.get("seeds", spec.get("seeds")),
        "eval_seed": record.get("eval_seed", spec.get("eval_seed")),
        "total_timesteps": (spec.get("total_timesteps") or {}).get(environment),
        "metric": record.get("metric"),
        "probability_of_improvement": comparison.get("probability_of_improvement"),
        "low": comparison.get("low"),
        "high": comparison.get("high"),
        "paired": comparison.get("paired"),
        "verdict": comparison.get("verdict"),
    }
    if tuned:
        choices = {}
        for label in (evolved, baseline):
            row = tuning.get(str(label).removesuffix(TUNED_SUFFIX)) or {}
            if "chosen" in row:
                choices[label] = row["chosen"]
        entry["tuned_choices"] = choices
        entry["tune_by"] = (record.get("tuning") or {}).get("tune_by", "mean")
    return entry


def _distilled(run_dir: Path, which: str) -> dict[str, Any] | None:
    saved = read_json(run_dir / DISTILL_FILE, default=None)
    if not isinstance(saved, dict):
        return None
    return (saved.get("candidates") or {}).get(which)
