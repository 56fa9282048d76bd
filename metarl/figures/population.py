"""Figures of population runs (PBT, CEM-RL, DvD), drawn from their histories.

Each function returns a :class:`matplotlib.figure.Figure` built without pyplot (nothing is
shown; save it with ``fig.savefig(path)``):

- :func:`plot_pbt`: every member's return and hyperparameter schedule, exploit events and
  the winning lineage;
- :func:`plot_cem_rl`: fitness over generations (the population's mean, the elites' mean,
  the best, and the mean actor's return), and the RL actors' fitness against the CEM
  actors' (every member's fitness as a dot, the means as lines);
- :func:`plot_dvd`: the population's diversity (log-det of the kernel over its actions),
  every member's return with the best and mean, and the diversity weight over training
  (the bandit's arm at every segment).

The x axis of the CEM-RL and DvD figures is environment steps (``env_steps`` of the
records).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from metarl.figures.style import new_figure

RL_COLOUR, CEM_COLOUR, MEAN_COLOUR = "C3", "C0", "black"


def _column(history: Sequence[Mapping[str, Any]], name: str) -> np.ndarray:
    return np.array([record[name] for record in history], np.float64)



def plot_pbt(history: Sequence[Mapping[str, Any]], lineage: Sequence[int],
             steps_per_update: int | None = None, title: str | None = None) -> Figure:
    """A PBT run (:attr:`metarl.population.pbt.PBTResult.history`): the return of every
    member over training, and one panel per explored hyperparameter with every member's
    schedule; exploit events are marked where a member took another's state, and the
    lineage of the final best member is drawn bold.

    Args:
        history: one record per segment (``fitness``, ``hypers``, ``source``, ``replaced``,
            ``returns [P, U]``).
        lineage: the member whose state the final best member had in each segment, one
            per segment (:func:`metarl.population.pbt.lineage` of it).
        steps_per_update: environment steps per update, for an x axis in steps.
        title: figure title.
    """
    if not history:
        raise ValueError("plot_pbt: the history is empty")
    names = [name for name, _ in history[0]["hypers"].items()
             if any(len(set(record["hypers"][name])) > 1 for record in history)]
    segment_updates = len(history[0]["returns"][0])
    scale = steps_per_update or 1
    size = len(history[0]["fitness"])
    chain = list(lineage)
    if len(chain) != len(history):
        raise ValueError(f"plot_pbt: the lineage has {len(chain)} members for "
                         f"{len(history)} segments")
    best = chain[-1]
    fig = new_figure(7.5, 2.6 * (1 + len(names)))
    axes = np.atleast_1d(fig.subplots(1 + len(names), 1, sharex=True, squeeze=False)[:, 0])
    colours = matplotlib.colormaps["tab20"](np.linspace(0.0, 1.0, max(size, 2)))
    returns = np.concatenate([np.asarray(r["returns"], np.float64) for r in history], axis=1)
    x = np.arange(1, returns.shape[1] + 1) * scale
    for member in range(size):
        axes[0].plot(x, returns[member], color=colours[member], lw=0.8, alpha=0.6)
    lineage_returns = np.concatenate([np.asarray(record["returns"][m], np.float64)
                                      for record, m in zip(history, chain, strict=True)])
    axes[0].plot(x, lineage_returns, color="black", lw=2.2, label=f"lineage of member {best}")
    axes[0].set_ylabel("episode return")
    axes[0].legend(fontsize="small")
    edges = np.arange(len(history) + 1) * segment_updates * scale
    for ax, name in zip(axes[1:], names, strict=True):
        values = np.array([record["hypers"][name] for record in history], np.float64)  # [S, P]
        for member in range(size):
            ax.step(edges, np.append(values[:, member], values[-1, member]), where="post",
                    color=colours[member], lw=0.9, alpha=0.7)
        chain_values = [values[s, m] for s, m in enumerate(chain)]
        ax.step(edges, chain_values + chain_values[-1:], where="post", color="black", lw=2.2)
        for s, record in enumerate(history[:-1]):
            replaced = np.flatnonzero(record["replaced"])
            ax.scatter(np.full(replaced.size, edges[s + 1]), values[s + 1, replaced],
                       marker="v", s=18, color="C3", zorder=3,
                       label="exploit (copied a better member)" if s == 0 and replaced.size
                       else None)
        if np.all(values > 0) and values.max() / values.min() > 20:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.legend(fontsize="small", loc="best")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("environment steps per member" if steps_per_update else "update")
    fig.suptitle(title or f"Population-based training: {size} members, {len(history)} segments")
    return fig

def plot_cem_rl(history: Sequence[Mapping[str, Any]], title: str | None = None) -> Figure:
    """A CEM-RL run (:attr:`metarl.population.cem_rl.CEMRLResult.history`): two panels
    over environment steps.

    - ``fitness``: the population's mean fitness, the elites' mean, the best, and the
      return of the distribution's mean actor (the run's result);
    - ``RL vs CEM actors``: every member's fitness as a dot (red: it took gradient steps
      before evaluation; blue: drawn by the cross-entropy method and left as drawn), and
      each group's mean as a line.
    """
    if not history:
        raise ValueError("plot_cem_rl: the history is empty")
    steps = _column(history, "env_steps")
    fig = new_figure(7.5, 6.0)
    fitness_ax, roles_ax = fig.subplots(2, 1, sharex=True)
    for name, label, style in (("mean_fitness", "population mean", dict(color="C0")),
                               ("elite_fitness", "elites' mean", dict(color="C2")),
                               ("best_fitness", "best member", dict(color="C1", ls="--")),
                               ("mean_return", "mean actor (result)",
                                dict(color=MEAN_COLOUR, lw=2.2))):
        fitness_ax.plot(steps, _column(history, name), label=label, **style)
    fitness_ax.set_ylabel("fitness (episode return)")
    fitness_ax.legend(fontsize="small")
    fitness = np.array([record["fitness"] for record in history], np.float64)  # [G, P]
    rl_actor = np.array([record["rl_actor"] for record in history], bool)
    x = np.repeat(steps[:, None], fitness.shape[1], axis=1)
    for mask, colour in ((rl_actor, RL_COLOUR), (~rl_actor, CEM_COLOUR)):
        if mask.any():
            roles_ax.scatter(x[mask], fitness[mask], s=10, alpha=0.45, color=colour)
    for name, colour, label in (("rl_fitness", RL_COLOUR, "RL actors (TD3 steps)"),
                                ("cem_fitness", CEM_COLOUR, "CEM actors")):
        values = _column(history, name)
        if np.any(np.isfinite(values)):
            roles_ax.plot(steps, values, color=colour, lw=1.8, label=label)
    roles_ax.set_ylabel("fitness by role")
    roles_ax.set_xlabel("environment steps")
    roles_ax.legend(fontsize="small")
    for ax in (fitness_ax, roles_ax):
        ax.grid(alpha=0.3)
    size = fitness.shape[1]
    fig.suptitle(title or f"CEM-RL: {size} actors ({int(rl_actor[0].sum())} RL), "
                          f"{len(history)} generations")
    return fig


def plot_dvd(history: Sequence[Mapping[str, Any]], title: str | None = None) -> Figure:
    """A DvD run (:attr:`metarl.population.dvd.DvDResult.history`): three panels over
    environment steps.

    - ``diversity``: the log-det of the RBF kernel over the members' actions (at each
      segment's end on states from the buffer; dotted: the mean over the segment's
      gradient steps). Its largest value is about 0 (members far apart);
    - ``return``: every member's mean episode return per segment, the best and the mean;
    - ``weight``: the diversity weight of each segment (dots: the bandit's arm).
    """
    if not history:
        raise ValueError("plot_dvd: the history is empty")
    steps = _column(history, "env_steps")
    fig = new_figure(7.5, 7.5)
    diversity_ax, return_ax, weight_ax = fig.subplots(3, 1, sharex=True)
    diversity_ax.plot(steps, _column(history, "diversity"), color="C4", lw=1.8,
                      label="at segment end")
    diversity_ax.plot(steps, _column(history, "train_diversity"), color="C4", ls=":",
                      label="mean over gradient steps")
    diversity_ax.set_ylabel("diversity (log-det)")
    diversity_ax.legend(fontsize="small")
    returns = np.array([record["returns"] for record in history], np.float64)  # [S, M]
    colours = matplotlib.colormaps["tab10"](np.arange(returns.shape[1]) % 10)
    for member in range(returns.shape[1]):
        return_ax.plot(steps, returns[:, member], color=colours[member], lw=0.8, alpha=0.6)
    return_ax.plot(steps, _column(history, "best_return"), color=MEAN_COLOUR, lw=2.2,
                   label="best member")
    return_ax.plot(steps, _column(history, "mean_return"), color=MEAN_COLOUR, ls="--",
                   label="mean")
    return_ax.set_ylabel("episode return")
    return_ax.legend(fontsize="small")
    weights = _column(history, "weight")
    weight_ax.step(steps, weights, where="pre", color="C2")
    weight_ax.scatter(steps, weights, s=12, color="C2",
                      label="arm played" if "arm" in history[0] else None)
    weight_ax.set_ylabel("diversity weight")
    weight_ax.set_xlabel("environment steps (population)")
    for ax in (diversity_ax, return_ax, weight_ax):
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"DvD: {returns.shape[1]} members, {len(history)} segments")
    return fig


__all__ = ["plot_cem_rl", "plot_dvd"]
