"""Render the verdict tables of the documentation from the records in ``docs/results``.

Each generated table sits between two markers in a Markdown page::

    <!-- verdicts:NAME begin -->
    ...
    <!-- verdicts:NAME end -->

and three declarative lists below say, for each NAME, which page holds it, which records it
reads and which comparisons it shows: :data:`BLOCKS` (the evidence pages' "Current
verdicts" of P(improvement) comparisons), :data:`FOUND` (the "what was found" table of
README.md and docs/index.md) and :data:`SPECIAL` (the tables of paired differences and of
search cost, whose records have layouts of their own: :data:`DISCOVERY_COST`, :data:`PBT`,
the CEM-RL and DvD records). ``python docs/render_verdicts.py`` rewrites every block;
``--check`` rewrites nothing and exits 1 naming each block whose page differs from its
records (``tests/test_generated_docs.py`` runs it). So a re-evaluation that changes a
verdict changes the page, or fails the suite until the page is rendered again.

In :data:`BLOCKS` and :data:`FOUND` every cell is P(improvement) of the evolved objective
over the column's baseline on the row's held-out seeds, its 95% interval and the verdict;
pooled rows (several evolution or meta-seeds) add how many runs alone gave that verdict. A
column says whether its baseline was tuned. Each row states its held-out seeds: their count
per run and the root key they are drawn from (``eval_seed``), and marks the root when the
record says it was reused (``eval_seed_reused``).

The script lives beside the pages it writes, not in ``metarl``: it reads committed records
only, imports nothing from the toolkit, and its table layouts are the pages' business.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from metarl.evolve import verdicts
from metarl.evolve.verdicts import settled_apart

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


@dataclass(frozen=True)
class Cell:
    """One comparison: P(improvement) ``p`` in [``low``, ``high``], its ``verdict``, and
    ``runs``, the single runs' verdicts where the comparison pools several."""

    p: float
    low: float
    high: float
    verdict: str
    runs: tuple[str, ...] = ()
    # a tuned choice of either side lay at the edge of its final grid: "grid" (which was not
    # widened past it) or "range" (the edge of the knob's valid range, where it cannot widen)
    edge: str = ""
    # the two tuned rows settled where the other never tuned (in any run pooled)
    apart: bool = False

    def text(self) -> str:
        pooled = ""
        if self.runs:
            pooled = f" ({sum(v == self.verdict for v in self.runs)} of {len(self.runs)})"
        edge = {"": "", "grid": f" {EDGE_MARK}", "range": f" {RANGE_MARK}"}[self.edge]
        apart = f" {APART_MARK}" if self.apart else ""
        return (f"{self.p:.2f} [{self.low:.2f}, {self.high:.2f}]: {self.verdict}{pooled}{edge}"
                f"{apart}")


@dataclass(frozen=True)
class Source:
    """A record and how to read it.

    ``kind`` is ``evaluation`` (``RUN/evaluations/N.json`` of one run), ``replicated`` (the
    same of a run with several evolution seeds, which pools them), ``comparison`` (a
    ``metarl compare`` ``comparison.json``: pooled over its runs, or ``between_runs``
    against the run labelled ``against``) or ``engines`` (the engines benchmark's pooled
    ``cartpole_evaluations.json``, its ``task`` and ``engine``). ``path`` is relative to
    ``docs/results``."""

    kind: str
    path: str
    task: str = ""
    engine: str = ""
    against: str = ""
    against_as: str = "start"

    def load(self) -> dict:
        return json.loads((RESULTS / self.path).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Text:
    """A cell that states a fact of the record (a count, a range) rather than a comparison."""

    value: str

    def text(self) -> str:
        return self.value


def _eval_seeds(record: dict, path: str = "") -> str:
    reused = " reused" if _reused(record, path) else ""
    return f"{record['seeds']} (root {record['eval_seed']}{reused})"


REUSED_NOTE = ("*reused*: an earlier evaluation of the same run drew its held-out seeds from "
               "this root, so the verdict was made on seeds seen before.")
EDGE_MARK = "‡"
EDGE_NOTE = (f"{EDGE_MARK}: a tuned choice of either side lay at the edge of its final grid "
             "(one not widened, or still at its edge after the cap of widening rounds); a "
             "wider grid could change the verdict.")
APART_MARK = verdicts.APART_MARK.strip()  # the mark `metarl evaluate` prints too
APART_NOTE = (f"{APART_MARK}: the two tuned rows settled where the other never tuned (a "
              "choice beyond the range the other side scored, which its grid never widened "
              "to reach); the verdict measures how far each tuning went as much as the "
              "objective.")
RANGE_MARK = "§"
RANGE_NOTE = (f"{RANGE_MARK}: a tuned choice lay at the end of its knob's valid range (PPO's "
              "clip ε at 0.8, whose next step would pass 1), where its grid cannot widen.")


def _with_notes(lines: list[str]) -> str:
    """The table, and below it what *reused* and the edge mark mean when a row has them."""
    table = "\n".join(lines)
    notes = [note for mark, note in ((" reused)", REUSED_NOTE), (EDGE_MARK, EDGE_NOTE),
                                     (RANGE_MARK, RANGE_NOTE), (APART_MARK, APART_NOTE))
             if mark in table]
    return "\n\n".join([table, " ".join(notes)]) if notes else table


def _reused(record: dict, path: str) -> bool:
    """The record's ``eval_seed_reused``; a record saved before that field existed
    (``path``, ``RUN/evaluations/N.json``) reused its root when an earlier evaluation of
    the same run drew from the same one."""
    if "eval_seed_reused" in record or not path:
        return bool(record.get("eval_seed_reused"))
    file = RESULTS / path
    return any(json.loads(other.read_text(encoding="utf-8")).get("eval_seed")
               == record["eval_seed"]
               for other in file.parent.glob("*.json")
               if other.stem.isdigit() and int(other.stem) < int(file.stem))


def _edge(tuning: dict, names: tuple[str, ...]) -> str:
    """How the tuned choices of ``names`` sit in their grids: ``"grid"`` if one lies at an
    edge the grid was not widened past, else ``"range"`` if one lies at the end of its
    knob's valid range (``widening.out_of_range``), else ``""``."""
    kinds = set()
    for name in names:
        search = tuning.get(name, {})
        beyond = (search.get("widening") or {}).get("out_of_range", {})
        kinds |= {"range" if beyond.get(knob) == end else "grid"
                  for knob, end in (search.get("at_edge") or {}).items() if end}
    return "grid" if "grid" in kinds else ("range" if kinds else "")


def _name(objective: str) -> tuple[str, bool]:
    """``"l2 (tuned)"`` -> ``("l2", True)``."""
    tuned = objective.endswith(" (tuned)")
    return objective.removesuffix(" (tuned)"), tuned


def cells(source: Source, env: str) -> tuple[dict[tuple[str, bool], Cell | Text], str]:
    """The comparisons ``source`` holds for ``env``, keyed by (baseline, tuned), and the
    held-out seeds they were judged on, as the table states them."""
    record = source.load()
    found: dict[tuple[str, bool], Cell | Text] = {}
    if source.kind == "evaluation":
        apart = settled_apart(record)
        tuning = record.get("tuning", {}).get("environments", {}).get(env, {})
        for c in record["statistics"]["environments"][env]["comparisons"]:
            evolved, baseline = _name(c["evolved"]), _name(c["baseline"])
            if evolved[0] == "evolved":
                edge = _edge(tuning, (evolved[0], baseline[0])) if evolved[1] and baseline[1] \
                    else ""
                found[baseline] = Cell(c["probability_of_improvement"], c["low"], c["high"],
                                       c["verdict"], edge=edge,
                                       apart=(env, c["evolved"], c["baseline"]) in apart)
        return found, _eval_seeds(record, source.path)
    if source.kind == "replicated":
        for c in record["pooled"]:
            if c["env_id"] == env:
                p = c["probability_of_improvement"]
                runs = tuple(v for v, n in c["counts"].items() for _ in range(n))
                found[_name(c["baseline"])] = Cell(p["value"], p["low"], p["high"],
                                                   c["verdict"], runs)
        return found, f"{len(record['replicates'])} × {_eval_seeds(record)}"
    if source.kind == "comparison":
        runs = record["runs"]
        if source.against:
            for c in record["between_runs"]:
                if c["env_id"] == env and c["second"] == source.against:
                    tuned = _name(c["objective"])[1]
                    found[(source.against_as, tuned)] = Cell(c["probability"], c["low"], c["high"],
                                                   c["outcome"])
            runs = [r for r in runs if r["label"] in (source.against, runs[0]["label"])][:1]
        evaluations = [_run_evaluation(run) for run in runs]
        if not source.against:
            apart = set().union(*(settled_apart(evaluation) for evaluation, _ in evaluations))
            for c in record["pooled"]:
                if c["env_id"] == env and _name(c["evolved"])[0] == "evolved":
                    p = c["probability"]
                    per_run = tuple(v for v, n in c["counts"].items() for _ in range(n))
                    found[_name(c["baseline"])] = Cell(
                        p["value"], p["low"], p["high"], c["outcome"], per_run,
                        apart=(env, c["evolved"], c["baseline"]) in apart)
        seeds = {_eval_seeds(*evaluation) for evaluation in evaluations}
        count = f"{len(runs)} × " if len(runs) > 1 else ""
        return found, count + " / ".join(sorted(seeds))
    if source.kind == "engines":
        engine = record["tasks"][source.task][source.engine]
        apart = {tuple(key[1:]) for run in engine["runs"] for key in run.get("settled_apart", [])}
        for c in engine["pooled"]:
            p = c["pooled_p_improvement"]
            evolved, baseline = _name(c["evolved"]), _name(c["baseline"])
            names = (evolved[0], baseline[0])
            edges = {_edge({name: {field: (run.get(field) or {}).get(name)
                                   for field in ("at_edge", "widening")} for name in names},
                           names)
                     for run in engine["runs"]} if evolved[1] and baseline[1] else set()
            edge = "grid" if "grid" in edges else ("range" if "range" in edges else "")
            found[baseline] = Cell(p["value"], p["low"], p["high"], c["pooled_verdict"],
                                   tuple(c["verdicts"]), edge=edge,
                                   apart=(c["evolved"], c["baseline"]) in apart)
        if source.engine == "evolution":  # evolution's objective against the other engine's
            for c in record["tasks"][source.task].get("evolution_vs_metagradient", []):
                p = c["p_evolution_better"]
                found[("metagradient", _name(c["row"])[1])] = Cell(p["value"], p["low"],
                                                                   p["high"], c["verdict"])
        sizes = {len(run["returns"]["evolved"]) for run in engine["runs"]}
        roots = sorted({run["eval_seed"] for run in engine["runs"]
                        if run.get("eval_seed") is not None})
        reused = " reused" if any(run.get("eval_seed_reused") for run in engine["runs"]) else ""
        root = (f"root {'/'.join(map(str, roots))}{reused}" if roots
                else "root not in the record")
        return found, f"{len(engine['runs'])} × {'/'.join(map(str, sorted(sizes)))} ({root})"
    if source.kind == "known_answers":
        task = record["tasks"][source.task]
        summary = task["engines"][source.engine]["summary"]
        p = summary["pooled_p_improvement"]
        found[("baseline", False)] = Cell(p["value"], p["low"], p["high"],
                                          summary["pooled_verdict"], tuple(summary["verdicts"]))
        runs = len(summary["verdicts"])
        found[("better_runs", False)] = Text(
            f"{summary['verdicts'].count('better')} of {runs}"
            + (f" ({summary['verdicts'].count('worse')} worse)"
               if "worse" in summary["verdicts"] else ""))
        found[("reached", False)] = Text(f"{summary['reached_known_answer']} of {runs}")
        steps = sorted(s for s in summary["agent_steps_to_known_answer"] if s is not None)
        found[("steps", False)] = Text(
            "—" if not steps else f"{steps[0]:,}" if steps[0] == steps[-1]
            else f"{steps[0]:,} to {steps[-1]:,}")
        return found, f"{runs} × {record['held_out_seeds']} (root {record['eval_seed']})"
    raise ValueError(f"Source.kind {source.kind!r}: use evaluation, replicated, comparison, "
                     "known_answers "
                     "or engines")


def _run_evaluation(run: dict) -> tuple[dict, str]:
    """The evaluation record a ``comparison.json`` run row read (its ``evaluation`` number,
    else the newest one of its run directory) and its path under ``docs/results``."""
    folder = ROOT / run["run_dir"] / "evaluations"
    number = run.get("evaluation")
    if number is None:
        number = max(int(p.stem) for p in folder.glob("*.json"))
    file = folder / f"{number}.json"
    return (json.loads(file.read_text(encoding="utf-8")),
            file.relative_to(RESULTS).as_posix())


@dataclass(frozen=True)
class Row:
    """One table row: ``search`` and ``task`` as the page names them, the ``env`` id the
    records file the comparisons under, and every source whose comparisons fill its cells
    (the first source holding a column's comparison fills it)."""

    search: str
    task: str
    env: str
    sources: tuple[Source, ...]
    note: str = ""
    against: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Column:
    """A column: its ``header`` and the (``baseline``, ``tuned``) comparison it shows."""

    header: str
    baseline: str
    tuned: bool
    plain: bool = False  # a fact of the record, not a comparison: no default/tuned in the header

    def title(self) -> str:
        return self.header if self.plain else (
            f"{self.header}, {'tuned' if self.tuned else 'default'}")


@dataclass(frozen=True)
class Block:
    """A generated table: the ``page`` it sits in, its columns and its rows."""

    page: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...] = ()


def _record_link(source: Source, page: str) -> str:
    """A link from ``page`` to the record of ``source``, named by its last folders."""
    target = Path(os.path.relpath(RESULTS / source.path, (ROOT / page).parent)).as_posix()
    parts = source.path.split("/")
    label = "/".join(parts[-3:] if parts[-2:-1] == ["evaluations"] else parts[-2:])
    return f"[`{label}`]({target})"


def render(block: Block) -> str:
    """The Markdown table of ``block``."""
    head = ["search", "task", "held-out seeds (root)",
            *(c.title() for c in block.columns),
            "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    previous = ""
    for row in block.rows:
        loaded = [cells(source, row.env) for source in row.sources]
        seeds = loaded[0][1]
        texts = []
        for column in block.columns:
            key = (column.baseline, column.tuned)
            cell = next((found[key] for found, _ in loaded if key in found), None)
            texts.append(cell.text() if cell else "—")
        search = row.search if row.search != previous else ""
        previous = row.search
        links = ", ".join(dict.fromkeys(_record_link(s, block.page) for s in row.sources))
        task = row.task + (f" {row.note}" if row.note else "")
        lines.append("| " + " | ".join([search, task, seeds, *texts, links]) + " |")
    return _with_notes(lines)


def _ev(path: str) -> Source:
    return Source("evaluation", path)


def _pooled(path: str, against: str = "", against_as: str = "start") -> Source:
    return Source("comparison", path, against=against, against_as=against_as)


VD = (Column("L2", "l2", False), Column("L2", "l2", True),
      Column("Huber", "huber", False), Column("Huber", "huber", True),
      Column("PPO's clipped L2", "ppo", False), Column("PPO's clipped L2", "ppo", True))
POLICY = (Column("PPO", "ppo", False), Column("PPO", "ppo", True),
          Column("DPO", "dpo", False), Column("DPO", "dpo", True))
START_TUNED = Column("its start", "start", True)
MINIGRID = ("Empty-5x5", "Empty-8x8", "EmptyRandom-5x5", "EmptyRandom-8x8", "Empty-6x6",
            "EmptyRandom-6x6")
BLOG = "value_distance_blog_cpu/evaluations/"
#: the CPU-sized searches judged again on fresh held-out seeds with widening grids
VD_FRESH = "value_distance_seeds/compare_fresh/comparison.json"
LPO_FRESH = "lpo_cpu_seeds/compare_fresh/comparison.json"
_ENGINES = "engines/cartpole_rejudged.json"  # fresh held-out seeds, widening grids
_ENGINES_FIRST = "engines/cartpole_evaluations.json"  # the first judgement, superseded
#: evolution's drifts again, every row tuned over one learning-rate grid from 1/3× to 47×
_ENGINES_ONE_GRID = "engines/cartpole_drift_one_grid.json"
_ONE_GRID = ", fresh seeds, one learning-rate grid (1/3× to 47×) for every row"


def _minigrid(search: str, run: str, start: str = "", evaluation: int = 1) -> tuple[Row, ...]:
    """A search's six MiniGrid rows: evaluation 1 (its start from a run of its own, pooled
    by ``metarl compare``), or a later ``evaluation`` made with ``--start``."""
    sources = [_ev(f"{run}/evaluations/{evaluation}.json")]
    if start:
        sources.append(_pooled(f"{run}/compare/comparison.json", against=start))
    return tuple(Row(search, layout + (" (held out)" if "6x6" in layout else ""),
                     f"xminigrid/MiniGrid-{layout}", tuple(sources)) for layout in MINIGRID)


#: Every generated block: its page, its columns and its rows, each row naming its records.
BLOCKS: dict[str, Block] = {
    "value_distance": Block("docs/evidence/value-distance.md", VD, (
        Row("the blog's settings, 1 × 55 generations × 32 × 2, 5e5 steps", "PPO, CartPole-v1",
            "CartPole-v1", (_ev(BLOG + "1.json"),)),
        Row("the same, L2 over a wider grid", "PPO, CartPole-v1", "CartPole-v1",
            (_ev(BLOG + "2.json"),)),
        Row("the same, fresh held-out seeds, grids widening themselves (its learning rate in "
            "×1.25 steps)", "PPO, CartPole-v1", "CartPole-v1", (_ev(BLOG + "3.json"),)),
        Row("the same, fresh held-out seeds again, its learning rate widened in the "
            "baselines' ×3 steps", "PPO, CartPole-v1", "CartPole-v1", (_ev(BLOG + "4.json"),)),
        Row("3 evolution seeds × 12 generations × 8 × 2, 65,536 steps", "PPO, CartPole-v1",
            "CartPole-v1", (_pooled("value_distance_seeds/compare_iqm/comparison.json"),)),
        Row("the same, fresh held-out seeds, grids widening themselves", "PPO, CartPole-v1",
            "CartPole-v1", (_pooled(VD_FRESH),)),
        Row("the same, started from L2's tuned setting, 3 × 30 generations",
            "PPO, CartPole-v1", "CartPole-v1",
            (Source("replicated", "value_distance_from_tuned_l2/full/evaluations/1.json"),)),
        Row("the same in successive-halving rungs, 8 × 2", "PPO, CartPole-v1", "CartPole-v1",
            (Source("replicated", "value_distance_from_tuned_l2/rungs/evaluations/1.json"),)),
        Row("the same in rungs, 16 × 4", "PPO, CartPole-v1", "CartPole-v1",
            (Source("replicated",
                    "value_distance_from_tuned_l2/rungs_16x4/evaluations/1.json"),)),
        Row("1 × 12 generations × 8 × 2, 8,192 steps", "TD3, Pendulum-v1", "Pendulum-v1",
            (_ev("value_distance_td3_pendulum_rerun/evaluations/2.json"),)),
        Row("the even form, 3 × 12 generations × 8 × 2", "PPO, CartPole-v1", "CartPole-v1",
            (Source("replicated", "value_distance_even/evaluations/1.json"),)),
    )),
    "policy_objectives": Block(
        "docs/evidence/policy-objectives.md",
        (*POLICY, Column("TA-LPO", "ta_lpo", False), Column("TA-LPO", "ta_lpo", True)), (
        Row("LPO, 3 evolution seeds × 20 generations × 8 × 2 × 2 tasks", "CartPole-v1",
            "CartPole-v1", (_pooled("lpo_cpu_seeds/compare_cartpole_iqm/comparison.json"),)),
        Row("LPO, 3 evolution seeds × 20 generations × 8 × 2 × 2 tasks", "Acrobot-v1",
            "Acrobot-v1", (_pooled("lpo_cpu_seeds/compare_acrobot_iqm/comparison.json"),)),
        *(Row("the same, fresh held-out seeds, grids widening themselves", env, env,
              (_pooled(LPO_FRESH),)) for env in ("CartPole-v1", "Acrobot-v1")),
        *(Row(f"LPO seed {seed} alone", env, env, (_ev(f"{run}/evaluations/{number}.json"),))
          for seed, run in enumerate(("lpo_cpu", "lpo_cpu_seeds/lpo_s1",
                                      "lpo_cpu_seeds/lpo_s2"))
          for env, number in (("CartPole-v1", 9 if seed == 0 else 6),
                              ("Acrobot-v1", 8 if seed == 0 else 5))),
        Row("TA-LPO, 1 × 20 × 8 × 2 × 2", "CartPole-v1", "CartPole-v1",
            (_ev("ta_lpo_cpu/evaluations/6.json"),)),
        Row("TA-LPO, 1 × 20 × 8 × 2 × 2", "Acrobot-v1", "Acrobot-v1",
            (_ev("ta_lpo_cpu/evaluations/5.json"),)),
        *(Row("TA-LPO, fresh held-out seeds, grids widening themselves", env, env,
              (_ev("ta_lpo_cpu/evaluations/7.json"),)) for env in ("CartPole-v1", "Acrobot-v1")),
        Row("LPO seed 0 against TA-LPO", "CartPole-v1", "CartPole-v1",
            (_pooled("lpo_vs_ta_lpo/comparison.json", "ta_lpo_cpu", "ta_lpo"),)),
        Row("LPO seed 0 against TA-LPO", "Acrobot-v1", "Acrobot-v1",
            (_pooled("lpo_vs_ta_lpo_acrobot/comparison.json", "ta_lpo_cpu", "ta_lpo"),)),
        Row("LPO seed 0 on tasks evolution never saw", "Breakout-MinAtar", "Breakout-MinAtar",
            (_ev("lpo_cpu/evaluations/4.json"),), "†"),
        Row("LPO seed 0 on tasks evolution never saw", "Catch-bsuite", "Catch-bsuite",
            (_ev("lpo_cpu/evaluations/4.json"),), "†"),
    )),
    "learned_optimizers": Block(
        "docs/evidence/learned-optimizers.md",
        (Column("Adam (PPO)", "ppo", False), Column("Adam (PPO)", "ppo", True)), (
            Row("`learned_optimizer_cpu.toml`", "CartPole-v1", "CartPole-v1",
                (_ev("learned_optimizer_cpu/evaluations/1.json"),), "†"),
            Row("`learned_optimizer_cpu.toml`", "Acrobot-v1", "Acrobot-v1",
                (_ev("learned_optimizer_cpu/evaluations/3.json"),)),
            *(Row("the same, fresh held-out seeds, grids widening themselves", env, env,
                  (_ev("learned_optimizer_cpu/evaluations/5.json"),))
              for env in ("CartPole-v1", "Acrobot-v1")),
            Row("`learned_optimizer_cpu.toml`", "Catch-bsuite (never seen)", "Catch-bsuite",
                (_ev("learned_optimizer_cpu/evaluations/4.json"),), "†"),
            Row("`learned_optimizer_cpu.toml`", "Breakout-MinAtar (never seen)",
                "Breakout-MinAtar", (_ev("learned_optimizer_cpu/evaluations/4.json"),), "†"),
            *(Row("`learned_optimizer_cpu_minatar.toml`", env, env,
                  (_ev("learned_optimizer_cpu_minatar/evaluations/1.json"),))
              for env in ("CartPole-v1", "Acrobot-v1", "Breakout-MinAtar")),
        )),
    "task_distributions": Block(
        "docs/evidence/task-distributions.md",
        (*POLICY, Column("its start", "start", False), START_TUNED), (
            *_minigrid("from PPO's clip, lr 3e-3", "task_distribution_minigrid"),
            *_minigrid("the same, fresh held-out seeds, grids widening themselves",
                       "task_distribution_minigrid", evaluation=2),
            *_minigrid("from zero drift, lr 3e-3", "task_distribution_zero_init",
                       "task_distribution_zero_init_start"),
            *_minigrid("the same, fresh held-out seeds, grids widening themselves",
                       "task_distribution_zero_init", evaluation=2),
            *_minigrid("from zero drift, lr 9e-3", "task_distribution_zero_init_lr9",
                       "task_distribution_zero_init_lr9_start"),
            *_minigrid("the same, fresh held-out seeds, grids widening themselves",
                       "task_distribution_zero_init_lr9", evaluation=2),
        )),
    "distillation": Block(
        "docs/evidence/distillation.md",
        (*(Column(f"P(network > formula {n})", f"distilled {n}", False, plain=True)
           for n in (1, 2, 4)),
         Column("P(network > L2), default", "l2", False, plain=True),
         Column("P(network > PPO), default", "ppo", False, plain=True)),
        (*(Row(run, "PPO, CartPole-v1", "CartPole-v1",
               (_ev(f"value_distance_seeds/{run}/evaluations/3.json"),))
           for run in ("vd_s0", "vd_s1", "vd_s2")),
         *(Row(run, env, env, (_ev(path),))
           for run, path in (("lpo_cpu", "lpo_cpu/evaluations/6.json"),
                             ("lpo_s1", "lpo_cpu_seeds/lpo_s1/evaluations/4.json"),
                             ("lpo_s2", "lpo_cpu_seeds/lpo_s2/evaluations/4.json"),
                             ("ta_lpo_cpu", "ta_lpo_cpu/evaluations/4.json"))
           for env in ("CartPole-v1", "Acrobot-v1")),
         *(Row("lpo_cpu, never seen", env, env, (_ev("lpo_cpu/evaluations/7.json"),))
           for env in ("Breakout-MinAtar", "Catch-bsuite")),
         Row("vd_s0, never seen", "Acrobot-v1", "Acrobot-v1",
             (_ev("value_distance_seeds/vd_s0/evaluations/4.json"),)))),
    "engines_known_answers": Block(
        "docs/evidence/engines.md",
        (Column("meta-seeds better than the baseline", "better_runs", False, plain=True),
         Column("pooled P(improvement), baseline untuned", "baseline", False, plain=True),
         Column("reached the known answer", "reached", False, plain=True),
         Column("agent-steps to reach it", "steps", False, plain=True)),
        tuple(Row(name, task, "", (Source("known_answers", "engines/known_answers.json", key,
                                          engine),))
              for key, task in (("outliers", "outliers (value distance, against L2)"),
                                ("drift", "drift (LPO, against PPO's clip)"))
              for engine, name in (("evolution", "evolution"),
                                   ("metagradient", "meta-gradients")))),
    "engines_cartpole": Block(
        "docs/evidence/engines.md",
        (Column("its start", "start", False), Column("its start", "start", True),
         Column("L2", "l2", False), Column("L2", "l2", True), Column("Huber", "huber", True),
         Column("PPO", "ppo", False), Column("PPO", "ppo", True), Column("DPO", "dpo", True),
         Column("meta-gradients' objective", "metagradient", False),
         Column("meta-gradients' objective", "metagradient", True)),
        tuple(Row(f"{name}, 3 meta-seeds{when}", task, "",
                  (Source("engines", record, key, engine),))
              for record, when in ((_ENGINES, ", fresh seeds, widening grids"),
                                   (_ENGINES_ONE_GRID, _ONE_GRID),
                                   (_ENGINES_FIRST, ", first judgement (superseded)"))
              for key, task in (("cartpole_value", "value distance, CartPole-v1"),
                                ("cartpole_drift", "drift (LPO), CartPole-v1"))
              for engine, name in (("evolution", "evolution"),
                                   ("metagradient", "meta-gradients"))
              if record != _ENGINES_ONE_GRID or (key, engine) == ("cartpole_drift",
                                                                 "evolution"))),
}

#: The front pages' "what was found": each search against the objective it started from,
#: both tuned (``start``: the search's starting point tuned over the learning rate alone; the
#: named baseline: tuned over its own grid), in one cell per row.
_VALUE_START = (("L2", "l2"), ("its start", "start"))
_BLOG_SETTLED = Row("value distance, the blog's settings (5e5 steps), fresh seeds, widening grids",
                    "PPO, CartPole-v1", "CartPole-v1", (_ev(BLOG + "4.json"),),
                    against=_VALUE_START)
_DRIFT_START = (("PPO", "ppo"), ("its start", "start"))


def _engine_rows(objective: str, task: str, key: str, against: tuple, record: str,
                 when: str) -> tuple[Row, Row]:
    """The engines benchmark's two searches of one objective (evolution, meta-gradients),
    each pooled over its three meta-seeds, against the objective they started from."""
    return tuple(Row(f"{objective} by {name}, 3 meta-seeds{when}", task, "",
                     (Source("engines", record, key, engine),), against=against)
                 for engine, name in (("evolution", "evolution"),
                                      ("metagradient", "meta-gradients")))


#: verdicts superseded by a judgement on fresh held-out seeds with grids widening themselves:
#: the front page leaves them out, the home page keeps them after the current ones
_SUPERSEDED = (
    Row("value distance, the blog's settings, its learning rate widened in ×1.25 steps "
        "(superseded)", "PPO, CartPole-v1", "CartPole-v1", (_ev(BLOG + "3.json"),),
        against=_VALUE_START),
    Row("value distance, the blog's settings, first evaluation (superseded)",
        "PPO, CartPole-v1", "CartPole-v1",
        (_ev(BLOG + "1.json"),), against=_VALUE_START),
    Row("value distance, the blog's settings, L2 over a hand-widened grid (superseded)",
        "PPO, CartPole-v1",
        "CartPole-v1", (_ev(BLOG + "2.json"),), against=(("L2", "l2"),)),
    Row("value distance, 3 evolution seeds (65,536 steps), seeds seen before (superseded)",
        "PPO, CartPole-v1", "CartPole-v1",
        (_pooled("value_distance_seeds/compare_iqm/comparison.json"),),
        against=(("L2", "l2"),)),
    Row("LPO drift, 3 evolution seeds, seeds seen before (superseded)", "CartPole-v1",
        "CartPole-v1", (_pooled("lpo_cpu_seeds/compare_cartpole_iqm/comparison.json"),),
        against=(("PPO", "ppo"),)),
    Row("LPO drift, 3 evolution seeds, seeds seen before (superseded)", "Acrobot-v1",
        "Acrobot-v1", (_pooled("lpo_cpu_seeds/compare_acrobot_iqm/comparison.json"),),
        against=(("PPO", "ppo"),)),
    *_engine_rows("value distance", "PPO, CartPole-v1", "cartpole_value", _VALUE_START,
                  _ENGINES_FIRST, ", first judgement (superseded)"),
    *_engine_rows("LPO drift", "CartPole-v1", "cartpole_drift", _DRIFT_START,
                  _ENGINES_FIRST, ", first judgement (superseded)"),
)
_FOUND_ROWS = (
    Row("value distance, 3 evolution seeds (65,536 steps), fresh seeds, widening grids",
        "PPO, CartPole-v1", "CartPole-v1", (_pooled(VD_FRESH),), against=(("L2", "l2"),)),
    *_engine_rows("value distance", "PPO, CartPole-v1", "cartpole_value", _VALUE_START,
                  _ENGINES, ", fresh seeds, widening grids"),
    *(Row("LPO drift, 3 evolution seeds, fresh seeds, widening grids", env, env,
          (_pooled(LPO_FRESH),), against=(("PPO", "ppo"),))
      for env in ("CartPole-v1", "Acrobot-v1")),
    *_engine_rows("LPO drift", "CartPole-v1", "cartpole_drift", _DRIFT_START, _ENGINES,
                  ", fresh seeds, widening grids"),
    Row(f"LPO drift by evolution, 3 meta-seeds{_ONE_GRID}", "CartPole-v1", "",
        (Source("engines", _ENGINES_ONE_GRID, "cartpole_drift", "evolution"),),
        against=_DRIFT_START),
    Row("learned optimiser", "PPO, CartPole-v1", "CartPole-v1",
        (_ev("learned_optimizer_cpu_minatar/evaluations/1.json"),),
        against=(("Adam", "ppo"),)),
)


def render_found(block: Block) -> str:
    """The front pages' table: each row's search against its start, both tuned."""
    head = ["search", "task", "held-out seeds (root)",
            "P(improvement) against its start, both tuned", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in block.rows:
        found, seeds = cells(row.sources[0], row.env)
        against = "; ".join(f"{label}: {found[(baseline, True)].text()}"
                            for label, baseline in row.against)
        links = ", ".join(_record_link(s, block.page) for s in row.sources)
        lines.append(f"| {row.search} | {row.task} | {seeds} | {against} | {links} |")
    return _with_notes(lines)


FOUND: dict[str, Block] = {
    "found_readme": Block("README.md", (), (_BLOG_SETTLED, *_FOUND_ROWS)),
    "found_index": Block("docs/index.md", (), (_BLOG_SETTLED, *_FOUND_ROWS, *_SUPERSEDED)),
}


def _signed(x: float, thousands: bool) -> str:
    """``-38912.0`` -> ``"−38.9k"``: differences as the pages write them."""
    text = f"{x / 1000:+.1f}k" if thousands else f"{x:+.1f}"
    return "0" if float(text.rstrip("k")) == 0 else text.replace("-", "−")


def _difference(stat: dict, lower_is_better: bool = False) -> str:
    """A paired difference ``{"mean", "ci95": [low, high]}`` with its verdict: better or
    worse (sooner or later, for a step count) when the interval excludes 0."""
    low, high = stat["ci95"]
    good, bad = ("sooner", "later") if lower_is_better else ("better", "worse")
    if low > 0 or high < 0:
        verdict = good if (low > 0) != lower_is_better else bad
    else:
        verdict = "no difference found"
    thousands = max(abs(stat["mean"]), abs(low), abs(high)) >= 1000
    return (f"{_signed(stat['mean'], thousands)} [{_signed(low, thousands)}, "
            f"{_signed(high, thousands)}]: {verdict}")


def _seed_list(seeds: list[int]) -> str:
    """The seeds a record lists: their count, and the range where they are consecutive."""
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{len(seeds)} ({seeds[0]} to {seeds[-1]})"
    return f"{len(seeds)} ({', '.join(map(str, seeds))})"


def _link(path: str, page: str) -> str:
    return _record_link(Source("evaluation", path), page)


#: discovery cost: (experiment as the page names it, record) per row group
DISCOVERY_COST = (("value distance, PPO CartPole-v1 (the main job)", "discovery_cost.json"),
                  ("LPO, PPO CartPole-v1 + Acrobot-v1", "discovery_cost_lpo.json"))


def render_discovery_cost(page: str) -> str:
    """Each cheaper method's first point that reaches the full run's verdict, against the
    search's start at its default setting and against the full run."""
    head = ["experiment", "held-out seeds (root)", "full run against its start, untuned",
            "method", "first point with the full run's verdict (share of `B`)",
            "there: against the start, untuned", "there: against the full run", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, path in DISCOVERY_COST:
        record = json.loads((RESULTS / path).read_text(encoding="utf-8"))
        budget = record["full_budget_agent_steps"]
        full = next(point for point in record["methods"]["open_es"]["points"]
                    if point["fraction"] == 1.0)["vs_start"]
        seeds = (f"{record['seeds']} × {record['held_out_seeds']} "
                 f"(root {record['eval_seed']})")
        first = True
        for method, result in record["methods"].items():
            if method == "open_es":
                continue
            at = result.get("reaches_full_verdict_at_fraction")
            point = next((p for p in result["points"] if p["fraction"] == at), None)
            cells = ["never", "—", "—"] if point is None else [
                f"{point['agent_steps_mean'] / budget:.0%}",
                Cell(**_cell(point["vs_start"])).text(), Cell(**_cell(point["vs_full"])).text()]
            lines.append("| " + " | ".join([
                label if first else "", seeds if first else "",
                (f"{Cell(**_cell(full)).text()} (`B` = {budget / 1e6:.2f}M agent-steps)"
                 if first else ""),
                method, *cells, _link(path, page) if first else ""]) + " |")
            first = False
    return "\n".join(lines)


def _cell(comparison: dict) -> dict:
    return {"p": comparison["p_improvement"], "low": comparison["low"],
            "high": comparison["high"], "verdict": comparison["verdict"]}


#: PBT: (task as the page names it, record)
PBT = (("PPO CartPole-v1, 2^18 steps per member (threshold 475)",
        "pbt_vs_fixed_ppo_cartpole.json"),
       ("SAC Pendulum-v1, 2e4 steps per member (threshold −200)",
        "pbt_vs_fixed_sac_pendulum.json"))


def render_pbt(page: str) -> str:
    """PBT's paired difference from the fixed and the tuned fixed population."""
    head = ["task", "seeds", "baseline", "final best member", "final median member",
            "median return over training (area)", "steps until the median reaches the threshold",
            "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, path in PBT:
        record = json.loads((RESULTS / path).read_text(encoding="utf-8"))
        for index, baseline in enumerate(("fixed", "tuned")):
            stats = record[f"pbt_minus_{baseline}"]
            lines.append("| " + " | ".join([
                label if index == 0 else "", _seed_list(record["seeds"]) if index == 0 else "",
                baseline, _difference(stats["final_best"]), _difference(stats["final_median"]),
                _difference(stats["auc_median"]),
                _difference(stats["steps_to_threshold"], lower_is_better=True),
                _link(path, page) if index == 0 else ""]) + " |")
    return "\n".join(lines)


def render_cem_rl_dvd(page: str) -> str:
    """CEM-RL against TD3 alone, and DvD's arms against no diversity term."""
    head = ["method", "task", "seeds", "baseline", "final return", "diversity", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cem = json.loads((RESULTS / "cem_rl_pendulum.json").read_text(encoding="utf-8"))
    lines.append("| " + " | ".join([
        "CEM-RL", f"TD3 {cem['env']}, {cem['environment_steps']:,} steps",
        _seed_list(cem["seeds"]), "TD3 alone",
        _difference(cem["final_return"]["cem_rl_minus_td3"]), "—",
        _link("cem_rl_pendulum.json", page)]) + " |")
    dvd = json.loads((RESULTS / "dvd_pendulum.json").read_text(encoding="utf-8"))
    for index, (arm, name) in enumerate((("bandit", "DvD, bandit over weights {0, 0.5}"),
                                         ("constant", "DvD, constant weight 0.5"))):
        stats = dvd["arms"][arm]
        lines.append("| " + " | ".join([
            name, f"TD3 {dvd['env']}, {dvd['population']} members × "
                  f"{dvd['steps_per_member']:,} steps" if index == 0 else "",
            _seed_list(dvd["seeds"]) if index == 0 else "", "no diversity term",
            f"best member {_difference(stats['best_return']['minus_none'])}; members' mean "
            f"{_difference(stats['mean_return']['minus_none'])}",
            _difference(stats["diversity"]["minus_none"]).replace(": better", ": more diverse"),
            _link("dvd_pendulum.json", page) if index == 0 else ""]) + " |")
    return "\n".join(lines)


#: Blocks with a layout of their own: name -> (page, renderer of the page's table).
def _number(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def render_classic_calibration(page: str) -> str:
    """Per environment of the classic suite: the untrained policy's and tuned PPO's
    interquartile means and where tuned PPO lies between the untrained policy and the
    ceiling."""
    path = "suites/classic_calibration.json"
    record = json.loads((RESULTS / path).read_text(encoding="utf-8"))
    head = ["environment", "side", "budget (steps per agent)", "untrained policy",
            "tuned PPO, IQM [95% CI]", "ceiling", "share of the way to the ceiling",
            "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    sides = {label: side for side in ("train", "test") for label in record["suite"][side]}
    for index, (label, entry) in enumerate(record["environments"].items()):
        for budget in entry["budgets"]:
            tuned = budget["tuned_iqm"]
            lines.append("| " + " | ".join([
                label, sides.get(label, "—"), f"{budget['total_timesteps']:,}",
                _number(budget["untrained_iqm"]),
                f"{_number(tuned['value'])} [{_number(tuned['low'])}, "
                f"{_number(tuned['high'])}]",
                _number(entry["ceiling"]),
                "—" if budget["ceiling_fraction"] is None else f"{budget['ceiling_fraction']:.2f}",
                _link(path, page) if index == 0 else ""]) + " |")
    return "\n".join(lines)


#: cross-environment verdicts: (discovery as the page names it, record, and the discovery
#: within a record of several, from benchmarks/studies/discoveries_on_suite.py)
SUITE_VERDICTS = (
    ("value distance, the blog's settings", "suite_evaluation.json", None),
    ("LPO, CPU-sized", "suites/discoveries_on_classic.json", "zoo:lpo_cpu"),
    ("TA-LPO, CPU-sized", "suites/discoveries_on_classic.json", "zoo:ta_lpo_cpu"),
    ("MiniGrid drift", "suites/discoveries_on_classic.json", "zoo:minigrid_drift"),
    ("learned optimiser, CPU-sized", "suites/discoveries_on_classic.json",
     "zoo:learned_optimizer_cpu"),
)


def _suite_judgement(path: str, discovery: str | None) -> dict | None:
    """The per-environment and pooled rows of one discovery's suite evaluation: the
    benchmark's first (empty-store) evaluation, or one discovery's of the study; None
    while the record does not hold it."""
    if not (RESULTS / path).is_file():
        return None
    record = json.loads((RESULTS / path).read_text(encoding="utf-8"))
    if discovery is None:
        return record["empty_store"]
    return next((judged for judged in record["discoveries"]
                 if judged["discovery"] == discovery), None)


def _estimate(estimate: dict | None, spec: str = ".2f") -> str:
    """``value [low, high]`` of an interval estimate, each number formatted by ``spec``;
    "—" for a missing one."""
    if not estimate:
        return "—"
    return (f"{estimate['value']:{spec}} [{estimate['low']:{spec}}, "
            f"{estimate['high']:{spec}}]")


def render_suite_verdicts(page: str) -> str:
    """Per environment and pooled: the evolved objective's and the baseline's IQM and
    P(improvement) (tuned comparisons), from the suite benchmark's records."""
    head = ["discovery", "environment", "comparison", "IQM [95% CI]", "baseline IQM [95% CI]",
            "P(improvement)", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    for label, path, discovery in SUITE_VERDICTS:
        record = _suite_judgement(path, discovery)
        if record is None:
            continue
        first = True
        for row in record["environments"]:
            p = row["probability_of_improvement"]
            lines.append("| " + " | ".join([
                label if first else "",
                row["environment"] + (" (trained on)" if row["trained_on"] else ""),
                f"{row['evolved']} vs {row['baseline']}", _estimate(row["evolved_iqm"], ".3g"),
                _estimate(row["baseline_iqm"], ".3g"),
                Cell(p["probability_of_improvement"], p["low"], p["high"],
                     row["verdict"]).text(),
                _link(path, page) if first else ""]) + " |")
            first = False
        for pooled in record["pooled"]:
            p = pooled["probability_of_improvement"]
            iqm = pooled["normalised_iqm"]
            lines.append("| " + " | ".join([
                "", f"**pooled** over {len(pooled['environments'])} (normalised)",
                f"{pooled['evolved']} vs {pooled['baseline']}",
                _estimate(iqm.get(pooled["evolved"]), ".3g"),
                _estimate(iqm.get(pooled["baseline"]), ".3g"),
                f"{_estimate(p)}: **{pooled['verdict']}**",
                ""]) + " |")
    return "\n".join(lines)


#: The blog-sized value distance judged on fresh held-out seeds, both measures.
BLOG_CLAIM = "blog_claim.json"
_MEASURES = {"mean_over_training": "mean return over training (learning speed)",
             "final_tenth": "last tenth of training (final performance)"}


def _setting(setting: dict, relative_to: dict, declared: bool = False) -> str:
    """``knob value`` pairs, a relative knob also as its multiple of the run's own value
    (``declared``: the values are those multiples already, as a tuning round keeps them)."""
    def one(knob: str, value: float) -> str:
        if knob not in relative_to:
            return f"{knob} {value:.3g}"
        if declared:
            return f"{knob} {value:.3g}×"
        return f"{knob} {value:.3g} ({value / relative_to[knob]:.3g}×)"
    return ", ".join(one(knob, value) for knob, value in setting.items())


def _choice(tuning: dict | None) -> str:
    """A tuned row's chosen setting, the knobs its grid still had it at the edge of, and
    how many settings it tried."""
    if not tuning:
        return "—"
    chosen = _setting(tuning["chosen"], tuning.get("relative_to") or {})
    edges = [knob for knob, side in (tuning.get("at_edge") or {}).items() if side]
    widened = (tuning.get("widening") or {}).get("rounds")
    return (chosen + (f"; at its grid's edge: {', '.join(edges)}" if edges else "; inside")
            + f" ({tuning['settings']} settings"
            + (f", {widened} widening rounds)" if widened else ")"))


def _widened(tuning: dict | None) -> str:
    """Each point the widening rounds added, with its IQM on the tuning seeds (a relative
    knob's grid is kept as multiples of the run's own value)."""
    points = (tuning or {}).get("widened") or []
    relative = (tuning or {}).get("relative_to") or {}
    return "; ".join(f"{_setting(p['setting'], relative, declared=True)}: {p['score']:.1f}"
                     for p in points) or "—"


def render_blog_claim(page: str) -> str:
    """Both measures of the blog-sized claim: per comparison, the two rows' IQM and the
    paired P(improvement); then every tuned row's chosen setting."""
    head = ["measure", "comparison", "evolved IQM [95% CI]", "baseline IQM [95% CI]",
            "P(improvement)", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    record = json.loads((RESULTS / BLOG_CLAIM).read_text(encoding="utf-8"))
    choices = record["tuned_choices"]

    first = True
    for measure, label in _MEASURES.items():
        judged = record["measures"][measure]
        for index, c in enumerate(judged["comparisons"]):
            lines.append("| " + " | ".join([
                label if index == 0 else "", f"{c['evolved']} vs {c['baseline']}",
                _estimate(judged["iqm"][c["evolved"]], ".1f"),
                _estimate(judged["iqm"][c["baseline"]], ".1f"),
                Cell(c["value"], c["low"], c["high"], c["verdict"]).text(),
                _link(BLOG_CLAIM, page) if first else ""]) + " |")
            first = False
    lines += ["", "| tuned row | chosen setting | points the widening added: tuning IQM |",
              "|---|---|---|"]
    lines += [f"| {name} | {_choice(tuning)} | {_widened(tuning)} |"
              for name, tuning in choices.items()]
    return "\n".join(lines)


#: The multi-environment study: one value distance meta-trained on classic's meta-train side,
#: one on CartPole-v1 alone, both judged on the meta-test side.
MULTI_ENV = "multi_env_transfer.json"


def render_multi_env(page: str) -> str:
    """Per run of the study: P(improvement) on each meta-test environment, and the pooled
    row over them (normalised IQM of both objectives, P(improvement) with its interval)."""
    record = json.loads((RESULTS / MULTI_ENV).read_text(encoding="utf-8"))
    runs = record["runs"]
    environments = runs[0]["evaluation"]["meta_test_pooled"][0]["environments"]
    head = ["meta-trained on", "evolution seed", "comparison", *environments,
            "pooled: normalised IQM, evolved / baseline", "pooled P(improvement)", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first_run = True
    for run in runs:
        evaluation = run["evaluation"]
        cells_of = {(row["environment"], row["baseline"]): row
                    for row in evaluation["meta_test_rows"]}
        for index, pooled in enumerate(evaluation["meta_test_pooled"]):
            p, iqm = pooled["probability_of_improvement"], pooled["normalised_iqm"]
            per_env = []
            for env in environments:
                row = cells_of[(env, pooled["baseline"])]
                q = row["probability_of_improvement"]
                per_env.append(Cell(q["probability_of_improvement"], q["low"], q["high"],
                                    row["verdict"]).text())
            lines.append("| " + " | ".join([
                ", ".join(evaluation["trained_on"]) if index == 0 else "",
                str(run["evolution_seed"]) if index == 0 else "",
                f"{pooled['evolved']} vs {pooled['baseline']}", *per_env,
                f"{iqm[pooled['evolved']]['value']:.2f} / {iqm[pooled['baseline']]['value']:.2f}",
                f"{_estimate(p)}: **{pooled['verdict']}**",
                _link(MULTI_ENV, page) if first_run and index == 0 else ""]) + " |")
        first_run = False
    return "\n".join(lines)


def render_multi_env_pooled(page: str) -> str:
    """The multi-environment study pooled over evolution seeds and the meta-test
    environments: each experiment against each tuned baseline, then the two experiments
    against each other."""
    record = json.loads((RESULTS / MULTI_ENV).read_text(encoding="utf-8"))
    across = record["across_seeds"]
    head = ["meta-trained on", "evolution seeds", "comparison",
            "normalised IQM, evolved / baseline [95% CI]", "P(improvement)", "record"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    trained_on = {run["experiment"]: ", ".join(run["evaluation"]["trained_on"])
                  for run in record["runs"]}

    previous = None
    for row in across["pooled"]:
        p, iqm = row["probability_of_improvement"], row["normalised_iqm"]
        first = row["experiment"] != previous
        lines.append("| " + " | ".join([
            trained_on[row["experiment"]] if first else "",
            str(row["evolution_seeds"]) if first else "",
            f"{row['evolved']} vs {row['baseline']}",
            f"{_estimate(iqm[row['evolved']])} / {_estimate(iqm[row['baseline']])}",
            f"{_estimate(p)}: **{row['verdict']}**",
            _link(MULTI_ENV, page) if previous is None else ""]) + " |")
        previous = row["experiment"]
    duel = across["head_to_head"]
    if duel:
        p = duel["probability_of_improvement"]
        each = "; ".join(f"seed {k}: {_estimate(seed['probability_of_improvement'])} "
                         f"{seed['verdict']}"
                         for k, seed in enumerate(duel["per_evolution_seed"]))
        lines.append("| " + " | ".join([
            f"{trained_on[duel['evolved']]}, against {trained_on[duel['baseline']]} alone",
            str(duel["evolution_seeds"]), "evolved (tuned) vs evolved (tuned)",
            f"per evolution seed: {each}", f"{_estimate(p)}: **{duel['verdict']}**",
            ""]) + " |")
    return "\n".join(lines)


SPECIAL = {
    "classic_calibration": ("docs/evidence/generalisation.md", render_classic_calibration),
    "suite_verdicts": ("docs/evidence/generalisation.md", render_suite_verdicts),
    "multi_env": ("docs/evidence/generalisation.md", render_multi_env),
    "multi_env_pooled": ("docs/evidence/generalisation.md", render_multi_env_pooled),
    "discovery_cost": ("docs/evidence/discovery-cost.md", render_discovery_cost),
    "pbt": ("docs/evidence/pbt.md", render_pbt),
    "cem_rl_dvd": ("docs/evidence/cem-rl-dvd.md", render_cem_rl_dvd),
    "blog_claim": ("docs/evidence/value-distance.md", render_blog_claim),
}


def rendered() -> dict[str, tuple[str, str]]:
    """Every block's name -> (page, its rendered table)."""
    tables = {name: (block.page, render(block)) for name, block in BLOCKS.items()}
    tables |= {name: (block.page, render_found(block)) for name, block in FOUND.items()}
    tables |= {name: (page, draw(page)) for name, (page, draw) in SPECIAL.items()}
    return tables


def _marker(name: str, end: bool) -> str:
    return f"<!-- verdicts:{name} {'end' if end else 'begin'} -->"


def apply(text: str, name: str, table: str) -> str:
    """``text`` with the block ``name`` replaced by ``table``; a page without both of the
    block's markers is an error naming them."""
    pattern = re.compile(re.escape(_marker(name, False)) + r"\n.*?" + re.escape(
        _marker(name, True)), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"no {_marker(name, False)} ... {_marker(name, True)} in the page")
    return pattern.sub(lambda _: f"{_marker(name, False)}\n{table}\n{_marker(name, True)}",
                       text, count=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page differs from its records")
    args = parser.parse_args(argv)
    pages: dict[str, str] = {}
    stale = []
    for name, (page, table) in rendered().items():
        text = pages.get(page) or (ROOT / page).read_text(encoding="utf-8")
        try:
            new = apply(text, name, table)
        except ValueError as error:
            print(f"{page}: {error}", file=sys.stderr)
            return 2
        if new != text:
            stale.append(f"{page}: block {name}")
        pages[page] = new
    if args.check:
        for line in stale:
            print(f"differs from its records: {line}; run python docs/render_verdicts.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for page, text in pages.items():
        (ROOT / page).write_text(text, encoding="utf-8")
    for line in stale:
        print(f"rewrote {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
