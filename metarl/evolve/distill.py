"""Symbolic distillation: closed-form expressions fitted to an evolved objective's function.

What is distilled (:data:`DISTILLED`): a ``value_distance`` run's ``d(x)``, ``x = value -
target`` (the same function whether the critic is PPO's or an off-policy learner's), an
``lpo`` run's drift ``D(r, A)`` and a ``ta_lpo`` run's ``D(r, A, p)`` with ``p`` the
training progress; for the drifts the whole drift the loss subtracts (PPO's clip included
when the run was built with ``ppo_init``).

**Where it is fitted.** On the inputs training visits: a few agents (``seeds`` per
``[inner]`` table of the run) train with the evolved objective while the loss term hands its
inputs (the value errors ``v - t``, for an off-policy critic the TD errors ``Q(s, a) - y`` of
every gradient step and critic; or the ratios, the advantages as the loss sees them and the
progress) to a ``jax.debug.callback``. The callback exists only in this program, built for
distilling from a wrapped copy of the objective, so training runs and their compiled
programs elsewhere are unchanged. The recorded rows are put in sorted order (the agents'
callbacks arrive in an order that varies from run to run), then ``samples`` of them are
drawn uniformly, so the fit is weighted by the visited distribution; 20% of them are held
out to report errors.

**The search.** Sparse regression over a fixed basis (:func:`value_basis`,
:func:`drift_basis`): every term vanishes where the objective must (``d(0) = 0``;
``D(1, A) = 0``), and a drift's formula is ``Max(0, sum)``, so ``D >= 0`` as LPO's is.
Orthogonal matching pursuit (scikit-learn's ``orthogonal_mp``) adds one term at a time,
giving a support of every size up to ``max_complexity`` in one pass; each support is then
improved by swapping terms while that lowers the least-squares error (greedy selection can
take one term correlated with two true ones and miss both), and refitted by least squares.
Coefficients are rounded to 5 significant digits and
the rounded formula, compiled as the ``symbolic`` objective compiles it, is what the held-out
errors are computed on. The formulas kept are the Pareto front: each more complex one has a
lower held-out error than every simpler one.

Output, in the run directory: ``distill.json`` (one entry per candidate, others kept),
``distill.tex`` (a table per candidate) and ``plots/distill_<candidate>.png`` (and
``plots/distill_residual_<candidate>.png`` for a drift).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metarl.config import ConfigError
from metarl.evolve.config import config_from_dict
from metarl.evolve.generation import build_learner
from metarl.objectives import lpo, ta_lpo
from metarl.objectives.symbolic import DRIFT_VARIABLES, VALUE_VARIABLES, compile_expression
from metarl.objectives.value_distance import value_distance
from metarl.runs.engine import read_config
from metarl.runs.layout import PLOTS_DIR, RunError, atomic_write, read_json, write_json
from metarl.runs.meta_params import CANDIDATE_FILES, read_meta_params

DISTILL_FILE = "distill.json"
DISTILL_TEX = "distill.tex"
HELD_OUT = 0.2
SIGNIFICANT_DIGITS = 5


@dataclass(frozen=True)
class DistillConfig:
    """How a run is distilled.

    Attributes:
        candidate: ``"mean"`` or ``"best"`` meta-parameters.
        max_complexity: the most terms a formula may have (1 to 12).
        samples: recorded inputs the fit and the held-out errors use (at least 100).
        seeds: agents trained per ``[inner]`` table to record the inputs.
        seed: PRNG seed of those agents and of the draw of samples.
        total_timesteps: override of each agent's budget (``None``: the run's).
    """

    candidate: str = "mean"
    max_complexity: int = 6
    samples: int = 20_000
    seeds: int = 2
    seed: int = 0
    total_timesteps: int | None = None

    def __post_init__(self):
        if self.candidate not in CANDIDATE_FILES:
            raise ConfigError(f"candidate: got {self.candidate!r}; allowed: "
                              f"{', '.join(CANDIDATE_FILES)}")
        for name, low, high in (("max_complexity", 1, 12), ("samples", 100, None),
                                ("seeds", 1, None)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, int) or value < low
                    or (high is not None and value > high)):
                bound = f"from {low} to {high}" if high else f"at least {low}"
                raise ConfigError(f"{name}: need an integer {bound}, got {value!r}")
        if self.total_timesteps is not None and (
                isinstance(self.total_timesteps, bool)
                or not isinstance(self.total_timesteps, int) or self.total_timesteps < 1):
            raise ConfigError(f"total_timesteps: need a positive integer, got "
                              f"{self.total_timesteps!r}")


@dataclass(frozen=True)
class Distilled:
    """An objective whose function can be distilled.

    Attributes:
        slot: the loss slot the function lives in.
        variables: its inputs, as the ``symbolic`` objectives name them.
        function: how the function is written (``d(x)``).
        network: ``(meta_params, options, clip_eps, inputs {variable: [M]}) -> [M]``.
        reference: a formula drawn for comparison (``None``: none).
    """

    slot: str
    variables: tuple[str, ...]
    function: str
    network: Callable[..., Any]
    reference: Callable[[float], str] | None = None


def _distance(meta_params, options, clip_eps, inputs):
    del clip_eps
    return value_distance(meta_params["value"], inputs["x"],
                          form=options.get("form", "scaled_l2"))


def _lpo_drift(meta_params, options, clip_eps, inputs):
    return lpo.drift(meta_params["policy"], inputs["r"], inputs["A"], clip_eps,
                     ppo_init=bool(options.get("ppo_init", False)))


def _ta_lpo_drift(meta_params, options, clip_eps, inputs):
    return ta_lpo.drift(meta_params["policy"], inputs["r"], inputs["A"], clip_eps,
                        inputs["p"], ppo_init=bool(options.get("ppo_init", False)))


def ppo_clip_drift(clip_eps: float) -> str:
    """PPO's clipping as a drift expression, ``relu((r - clip(r, 1±eps)) A)``."""
    return f"Max(0, (r - Min(Max(r, {1 - clip_eps:g}), {1 + clip_eps:g}))*A)"


DISTILLED = {
    "value_distance": Distilled("value", VALUE_VARIABLES, "d(x)", _distance,
                                lambda clip_eps: "0.5*x**2"),
    "lpo": Distilled("policy", ("r", "A"), "D(r, A)", _lpo_drift, ppo_clip_drift),
    "ta_lpo": Distilled("policy", DRIFT_VARIABLES, "D(r, A, p)", _ta_lpo_drift,
                        ppo_clip_drift),
}


def value_basis() -> list[str]:
    """Candidate terms of a value distance, each zero at ``x = 0``: powers ``x^1..x^4``,
    ``|x|``, ``x|x|``, ``|x|^3``, ``x^2 tanh(x)``, ``x tanh(x/c)`` and the pseudo-Huber
    ``sqrt(1 + (x/c)^2) - 1`` at ``c = 0.5, 1, 2``."""
    terms = ["x", "x**2", "x**3", "x**4", "Abs(x)", "x*Abs(x)", "Abs(x)**3", "x**2*tanh(x)"]
    for c in (0.5, 1, 2):
        terms += [f"x*tanh(x/{c:g})", f"sqrt(1 + (x/{c:g})**2) - 1"]
    return terms


def drift_basis(clip_eps: float, progress: bool) -> list[str]:
    """Candidate terms of a drift, each zero at ``r = 1``: ``u``, ``u A``, ``u |A|``,
    ``u A^2`` for LPO's ``u`` in ``r - 1``, ``(r-1)^2``, ``log r``, ``(log r)^2``; the
    one-sided ``relu(±u A)`` for ``u = r - 1, log r``; DPO's soft excess
    ``relu(u A - c tanh(u A / c))`` for ``u = r - 1`` (``c = 0.5, 2``) and ``u = log r``
    (``c = 0.3, 1``); PPO's clip drift at ``clip_eps``. With ``progress`` each term also
    times ``p``."""
    terms = []
    for u in ("(r - 1)", "(r - 1)**2", "log(r)", "log(r)**2"):
        terms += [u, f"{u}*A", f"{u}*Abs(A)", f"{u}*A**2"]
    for u in ("(r - 1)", "log(r)"):
        terms += [f"Max(0, {u}*A)", f"Max(0, -{u}*A)"]
    for u, scales in (("(r - 1)", (0.5, 2)), ("log(r)", (0.3, 1))):
        terms += [f"Max(0, {u}*A - {c:g}*tanh({u}*A/{c:g}))" for c in scales]
    terms.append(ppo_clip_drift(clip_eps))
    if progress:
        terms += [f"p*({term})" for term in terms]
    return terms


def _columns(terms: list[str], variables: tuple[str, ...], inputs: dict[str, np.ndarray]
             ) -> np.ndarray:
    """``[M, K]`` values of each term on the inputs (float64)."""
    import sympy

    symbols = [sympy.Symbol(v, real=True) for v in variables]
    namespace = {v: s for v, s in zip(variables, symbols, strict=True)}
    columns = []
    with np.errstate(all="ignore"):
        for term in terms:
            fn = sympy.lambdify(symbols, sympy.sympify(term, locals=namespace), "numpy")
            values = np.broadcast_to(np.asarray(fn(*(inputs[v] for v in variables)),
                                                np.float64), inputs[variables[0]].shape)
            columns.append(values)
    return np.stack(columns, axis=1)


def fit_formulas(inputs: dict[str, np.ndarray], target: np.ndarray, terms: list[str],
                 variables: tuple[str, ...], max_complexity: int, held_out: np.ndarray,
                 nonnegative: bool = False) -> list[dict[str, Any]]:
    """Sparse formulas ``sum_k c_k term_k`` for ``target``, simplest first (the Pareto
    front of held-out error against number of terms).

    Args:
        inputs: variable -> ``[M]`` samples (drawn from the visited distribution).
        target: ``[M]`` the function's values there.
        terms: the basis, sympy expressions in ``variables``.
        variables: the formula's inputs.
        max_complexity: most terms.
        held_out: ``[M]`` bool, the samples the errors are reported on (not fitted).
        nonnegative: wrap the sum as ``Max(0, sum)``.

    Returns:
        ``[{"terms", "nodes", "expression", "latex", "mse", "r2"}, ...]``: ``mse`` and
        ``r2`` on the held-out samples, of the rounded formula as printed.
    """
    import sympy
    from sklearn.linear_model import orthogonal_mp

    features = _columns(terms, variables, inputs)
    train = ~held_out
    usable = np.all(np.isfinite(features), axis=0)
    norms = np.linalg.norm(np.where(usable, features, 0.0)[train], axis=0)
    usable &= norms > 1e-12 * max(float(norms.max(initial=0.0)), 1e-300)
    index = np.flatnonzero(usable)
    if index.size == 0:
        raise RunError("no basis term is finite and non-zero on the visited inputs")
    scaled = features[train][:, index] / norms[index]
    steps = min(max_complexity, index.size)
    with warnings.catch_warnings():  # OMP stops early once the columns are exhausted
        warnings.simplefilter("ignore", RuntimeWarning)
        path = np.asarray(orthogonal_mp(scaled, target[train], n_nonzero_coefs=steps,
                                        return_path=True)).reshape(index.size, -1)
    namespace = {v: sympy.Symbol(v, real=True) for v in variables}
    found, best = [], math.inf
    for step in range(path.shape[1]):
        support = _refined(scaled, target[train], list(np.flatnonzero(path[:, step])))
        if not support:
            continue
        solution = np.linalg.lstsq(scaled[:, support], target[train], rcond=None)[0]
        coefficients = np.zeros(index.size)
        coefficients[support] = solution / norms[index][support]
        chosen = np.flatnonzero(coefficients)
        if chosen.size == 0:
            continue
        expression = sympy.Add(*(
            sympy.Float(_rounded(coefficients[k]), SIGNIFICANT_DIGITS)
            * sympy.sympify(terms[index[k]], locals=namespace) for k in chosen))
        if nonnegative:
            expression = sympy.Max(0, expression)
        errors = _errors(str(expression), variables, inputs, target, held_out)
        if errors["mse"] < best:
            best = errors["mse"]
            found.append({"terms": int(chosen.size),
                          "nodes": int(sympy.count_ops(expression)),
                          "expression": str(expression), "latex": sympy.latex(expression),
                          **errors})
    return found


def _refined(features: np.ndarray, target: np.ndarray, support: list[int],
             passes: int = 3) -> list[int]:
    """``support`` improved by swaps: each chosen column is replaced by the unchosen one that
    lowers the least-squares residual most, until no swap helps (greedy OMP can pick a
    column correlated with two true terms and miss both)."""
    def residual(columns):
        solution, *_ = np.linalg.lstsq(features[:, columns], target, rcond=None)
        return float(np.sum(np.square(features[:, columns] @ solution - target)))

    current = residual(support) if support else math.inf
    for _ in range(passes):
        improved = False
        for position in range(len(support)):
            for candidate in range(features.shape[1]):
                if candidate in support:
                    continue
                trial = support[:position] + [candidate] + support[position + 1:]
                value = residual(trial)
                if value < current * (1 - 1e-9):
                    support, current, improved = trial, value, True
        if not improved:
            break
    return sorted(support)


def _rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _errors(expression: str, variables: tuple[str, ...], inputs: dict[str, np.ndarray],
            target: np.ndarray, where: np.ndarray) -> dict[str, float]:
    """Mean squared error and R^2 of ``expression`` (compiled as the ``symbolic`` objective
    compiles it) against ``target`` on the samples ``where``."""
    fn = compile_expression(expression, variables)
    predicted = np.asarray(fn(*(inputs[v][where] for v in variables)), np.float64)
    truth = target[where]
    mse = float(np.mean(np.square(predicted - truth)))
    variance = float(np.var(truth))
    return {"mse": mse, "r2": 1.0 - mse / variance if variance > 0 else float("nan")}


def record_inputs(config, meta_params, distilled: Distilled, seeds: int, seed: int,
                  total_timesteps: int | None = None) -> dict[str, np.ndarray]:
    """The inputs of the evolved loss term over the training of ``seeds`` agents per
    ``[inner]`` table: variable -> ``[M]`` float64 (``x``; or ``r``, ``A``, ``p``), the
    ``M`` rows sorted (by ``x``; by ``r``, then ``A``, then ``p``), so that the same
    training gives the same arrays."""
    objective = config.objective.build()
    term = getattr(objective, distilled.slot)
    batches: list[tuple[np.ndarray, ...]] = []

    def sink(*arrays):
        batches.append(tuple(np.asarray(a, np.float64).ravel() for a in arrays))

    def loss(params, inputs):
        if distilled.slot == "value":
            jax.debug.callback(sink, inputs.values - inputs.targets)
        else:
            progress = jnp.broadcast_to(inputs.progress, inputs.ratio.shape)
            jax.debug.callback(sink, inputs.ratio, inputs.advantages, progress)
        return term.loss(params, inputs)

    recording = dataclasses.replace(objective,
                                    **{distilled.slot: dataclasses.replace(term, loss=loss)})
    keys = jax.random.split(jax.random.PRNGKey(seed), seeds)
    for inner in config.inner:
        if total_timesteps is not None:
            inner = inner.replace(total_timesteps=total_timesteps)
        learner = build_learner(inner, recording)
        jax.block_until_ready(jax.jit(jax.vmap(learner.train, in_axes=(0, None)))(
            keys, meta_params))
    jax.effects_barrier()
    names = ("x",) if distilled.slot == "value" else DRIFT_VARIABLES
    columns = [np.concatenate([batch[i] for batch in batches]) for i in range(len(names))]
    # Under vmap each agent's callback is a separate, unordered effect, which XLA may run in
    # either order: the batches arrive in an order that changes from run to run. Rows in
    # sorted order make the samples drawn from them depend only on the values recorded.
    order = np.lexsort(columns[::-1])
    return {name: column[order] for name, column in zip(names, columns, strict=True)}


def distill_run(run_dir: str | Path, candidate: str = "mean", max_complexity: int = 6,
                samples: int = 20_000, seeds: int = 2, seed: int = 0,
                total_timesteps: int | None = None, plots: bool = True) -> dict[str, Any]:
    """Distil the evolved function of the evolution run in ``run_dir`` (see the module
    docstring and :class:`DistillConfig` for the options); saves ``distill.json``,
    ``distill.tex`` and, with ``plots``, the figures. Returns the candidate's entry of
    ``distill.json`` (with ``"path"`` and ``"plots"``)."""
    options = DistillConfig(candidate, max_complexity, samples, seeds, seed, total_timesteps)
    run_dir = Path(run_dir)
    config = read_config(run_dir, config_from_dict)
    name = config.objective.name
    if name not in DISTILLED:
        raise ConfigError(f"objective {name!r} has no evolved function to distil; "
                          f"distillable: {', '.join(DISTILLED)}")
    distilled = DISTILLED[name]
    path = run_dir / CANDIDATE_FILES[candidate]
    if not path.is_file():
        raise RunError(f"{run_dir} has no {candidate} meta-parameters ({path.name})")
    objective = config.objective.build()
    meta_params = read_meta_params(path, objective.init(jax.random.PRNGKey(0)))
    recorded = record_inputs(config, meta_params, distilled, options.seeds, options.seed,
                             options.total_timesteps)
    count = recorded[next(iter(recorded))].size
    if count == 0:
        raise RunError(f"training {run_dir}'s objective recorded no loss inputs")
    rng = np.random.default_rng(options.seed)
    chosen = rng.choice(count, size=min(options.samples, count), replace=False)
    inputs = {v: recorded[v][chosen] for v in distilled.variables}
    clip_eps = float(getattr(config.inner[0], "clip_eps", 0.2))
    target = np.asarray(distilled.network(meta_params, config.objective.options, clip_eps,
                                          {v: jnp.asarray(a, jnp.float32)
                                           for v, a in inputs.items()}), np.float64)
    held_out = rng.random(chosen.size) < HELD_OUT
    terms = (value_basis() if distilled.slot == "value"
             else drift_basis(clip_eps, "p" in distilled.variables))
    formulas = fit_formulas(inputs, target, terms, distilled.variables,
                            options.max_complexity, held_out,
                            nonnegative=distilled.slot == "policy")
    reference = None
    if distilled.reference is not None:
        text = distilled.reference(clip_eps)
        reference = {"expression": text,
                     **_errors(text, distilled.variables, inputs, target, held_out)}
    entry = {
        "objective": name,
        "function": distilled.function,
        "variables": list(distilled.variables),
        "candidate": candidate,
        "meta_params_file": path.name,
        "recorded": {"seeds_per_inner": options.seeds, "seed": options.seed,
                     "environments": list(config.task_labels),
                     "total_timesteps": options.total_timesteps, "inputs": int(count)},
        "samples": {"fit": int((~held_out).sum()), "held_out": int(held_out.sum())},
        "quantiles": {v: _quantiles(a) for v, a in inputs.items()},
        "basis": terms,
        "method": "orthogonal matching pursuit (sklearn.linear_model.orthogonal_mp), "
                  f"coefficients rounded to {SIGNIFICANT_DIGITS} significant digits",
        "network_variance": float(np.var(target[held_out])),
        "reference": reference,
        "formulas": formulas,
    }
    saved = read_json(run_dir / DISTILL_FILE, default=None)
    saved = saved if isinstance(saved, dict) and isinstance(saved.get("candidates"),
                                                           dict) else {"candidates": {}}
    saved["candidates"][candidate] = entry
    write_json(run_dir / DISTILL_FILE, saved, run_dir=run_dir)
    atomic_write(run_dir / DISTILL_TEX, distill_latex(saved).encode(), run_dir)
    written = []
    if plots:
        written = save_figures(run_dir, config.name, entry, distilled, meta_params,
                               config.objective.options, clip_eps, inputs)
    return {**entry, "path": str(run_dir / DISTILL_FILE),
            "plots": [str(p) for p in written]}


def _quantiles(values: np.ndarray) -> dict[str, float]:
    levels = (0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999)
    return {f"{q:g}": float(v) for q, v in zip(levels, np.quantile(values, levels),
                                                strict=True)}


def distill_latex(saved: dict[str, Any]) -> str:
    """``distill.json``'s formulas as LaTeX tables, one per candidate."""
    parts = []
    for candidate, entry in saved.get("candidates", {}).items():
        function = entry["function"].replace("(", r"\,(")
        rows = [rf"{f['terms']} & {f['nodes']} & ${f['latex']}$ & {f['mse']:.3g} & "
                rf"{f['r2']:.4f} \\" for f in entry["formulas"]]
        parts.append("\n".join([
            rf"% {entry['objective']}: {entry['function']} of the {candidate} candidate",
            r"\begin{tabular}{rrlrr}",
            rf"terms & nodes & ${function}$ & held-out MSE & $R^2$ \\ \hline",
            *rows,
            r"\end{tabular}", ""]))
    return "\n".join(parts)


def format_distillation(entry: dict[str, Any]) -> str:
    """A candidate's formulas as a text table."""
    lines = [f"{entry['objective']}: {entry['function']} of the {entry['candidate']} "
             f"candidate, {entry['samples']['fit']} samples fitted, "
             f"{entry['samples']['held_out']} held out (network variance "
             f"{entry['network_variance']:.3g})",
             f"{'#':>2} {'terms':>5} {'nodes':>5} {'held-out MSE':>12} {'R^2':>8}  formula"]
    for number, f in enumerate(entry["formulas"]):
        lines.append(f"{number:>2} {f['terms']:>5} {f['nodes']:>5} {f['mse']:>12.4g} "
                     f"{f['r2']:>8.4f}  {f['expression']}")
    reference = entry.get("reference")
    if reference:
        lines.append(f"reference {reference['expression']}: held-out MSE "
                     f"{reference['mse']:.4g}, R^2 {reference['r2']:.4f}")
    return "\n".join(lines)


def _shown(formulas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The simplest, a middle and the most accurate formula (fewer when fewer exist)."""
    picks = sorted({0, len(formulas) // 2, len(formulas) - 1})
    return [formulas[i] for i in picks if formulas]


def save_figures(run_dir: Path, run_name: str, entry: dict[str, Any], distilled: Distilled,
                 meta_params, options, clip_eps: float, inputs: dict[str, np.ndarray]
                 ) -> list[Path]:
    """Draw the network with its formulas (and a drift's residual) into ``plots/``."""
    from metarl.figures.distill import (
        plot_distilled_distance,
        plot_distilled_drift,
        plot_drift_residual,
    )

    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    which = entry["candidate"]
    shown = _shown(entry["formulas"])
    title = f"{run_name}: {entry['function']} of the {which} candidate and its formulas"

    def network(**values):
        arrays = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in values.values()))
        return np.asarray(distilled.network(meta_params, options, clip_eps,
                                            dict(zip(values, arrays, strict=True))))

    def formula(f, **values):
        return np.asarray(compile_expression(f["expression"], distilled.variables)(
            *(values[v] for v in distilled.variables)))

    def label(f):
        return f"{f['terms']} terms, MSE {f['mse']:.2g}: {_short(f['expression'])}"

    written = []
    if distilled.slot == "value":
        lo, hi = _span(inputs["x"])
        x = np.linspace(lo, hi, 401)
        fig = plot_distilled_distance(x, network(x=x), {label(f): formula(f, x=x)
                                                         for f in shown}, inputs["x"], title)
        written.append(_save(fig, out / f"distill_{which}.png"))
        return written
    progress = 0.5
    extra = {"p": progress} if "p" in distilled.variables else {}
    lo, hi = _span(inputs["r"])
    ratio = np.linspace(max(lo, 1e-3), hi, 301)
    slices = {}
    for advantage in (-1.5, -0.5, 0.5, 1.5):
        values = {"r": ratio, "A": np.full_like(ratio, advantage), **extra}
        slices[advantage] = (network(**values), {label(f): formula(f, **values)
                                                 for f in shown})
    at = f" at progress p = {progress:g}" if extra else ""
    written.append(_save(plot_distilled_drift(ratio, slices, inputs["r"], title + at),
                         out / f"distill_{which}.png"))
    if shown:
        advantage = np.linspace(-3.0, 3.0, 121)
        grid_r, grid_a = np.meshgrid(ratio, advantage)
        values = {"r": grid_r, "A": grid_a, **extra}
        best = shown[-1]
        residual = formula(best, **values) - network(**values)
        written.append(_save(plot_drift_residual(
            ratio, advantage, residual, (inputs["r"], inputs["A"]),
            label=f"{best['terms']}-term formula",
            title=f"{run_name}: residual of the {best['terms']}-term formula{at} (contours: "
                  "visited inputs)"), out / f"distill_residual_{which}.png"))
    return written


def _span(values: np.ndarray) -> tuple[float, float]:
    """A plotting range covering 99.8% of ``values`` with a margin."""
    lo, hi = np.quantile(values, (0.001, 0.999))
    pad = 0.25 * (hi - lo) if hi > lo else 1.0
    return float(lo - pad), float(hi + pad)


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _save(fig, path: Path) -> Path:
    from metarl.figures.style import save_png

    return save_png(fig, path)


def distilled_objective(run_dir: str | Path, number: int, candidate: str = "mean"
                        ) -> dict[str, Any]:
    """Formula ``number`` of ``distill.json`` (the candidate's list, simplest first) as an
    ``[objective]`` table: ``{"name": "symbolic", "options": {"value": ...}}`` for a value
    distance, ``symbolic_drift`` with ``drift`` for a drift.

    Raises:
        RunError: the run has no distillation of ``candidate``.
        ConfigError: no formula ``number``.
    """
    run_dir = Path(run_dir)
    saved = read_json(run_dir / DISTILL_FILE, default=None)
    entry = ((saved or {}).get("candidates") or {}).get(candidate)
    if entry is None:
        raise RunError(f"{run_dir} has no distillation of the {candidate} candidate; run "
                       f"metarl distill {run_dir} --candidate {candidate} first")
    formulas = entry["formulas"]
    if isinstance(number, bool) or not isinstance(number, int) or not (
            0 <= number < len(formulas)):
        raise ConfigError(f"formula {number!r} does not exist; the {candidate} candidate "
                          f"of {run_dir} has formulas 0 to {len(formulas) - 1}")
    expression = formulas[number]["expression"]
    if entry["variables"] == list(VALUE_VARIABLES):
        return {"name": "symbolic", "options": {"value": expression}}
    return {"name": "symbolic_drift", "options": {"drift": expression}}


def write_experiment(run_dir: str | Path, number: int, candidate: str = "mean") -> Path:
    """An experiment file training formula ``number`` of ``distill.json`` (the candidate's
    list, simplest first) as the ``symbolic`` (or ``symbolic_drift``) objective with the
    run's other settings: ``distilled_<candidate>_<number>.json`` in the run directory."""
    run_dir = Path(run_dir)
    try:
        symbolic = distilled_objective(run_dir, number, candidate)
    except ConfigError as error:
        raise ConfigError(f"--write-experiment: {error}") from None
    expression = next(iter(symbolic["options"].values()))
    data = read_config(run_dir, config_from_dict).to_dict()
    data["objective"] = symbolic
    data["name"] = f"{data.get('name', 'run')}-distilled-{candidate}-{number}"
    data["description"] = (f"formula {number} distilled from the {candidate} candidate of "
                           f"{run_dir}: {expression}")
    config_from_dict(data)  # it must validate as an experiment
    path = run_dir / f"distilled_{candidate}_{number}.json"
    write_json(path, data, run_dir=run_dir)
    return path
