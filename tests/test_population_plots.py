"""The figures of CEM-RL and DvD runs draw from their histories (made up here: drawing
needs no training)."""

from __future__ import annotations

import numpy as np
import pytest

from metarl.figures.population import plot_cem_rl, plot_dvd


def cem_rl_history(generations: int = 5, size: int = 6) -> list[dict]:
    rng = np.random.default_rng(0)
    history = []
    for g in range(generations):
        fitness = rng.normal(-1000 + 150 * g, 100, size)
        fitness[-1] = np.nan if g == 2 else fitness[-1]  # a member that went non-finite
        rl = [i < size // 2 for i in range(size)]
        valid = fitness[~np.isnan(fitness)]
        history.append({
            "fitness": list(fitness), "rl_actor": rl,
            "mean_fitness": valid.mean(), "elite_fitness": np.sort(valid)[-3:].mean(),
            "best_fitness": valid.max(), "rl_fitness": np.nanmean(fitness[: size // 2]),
            "cem_fitness": np.nanmean(fitness[size // 2:]), "mean_return": -900 + 150 * g,
            "env_steps": (g + 1) * size * 200,
        })
    return history


def dvd_history(segments: int = 4, size: int = 3) -> list[dict]:
    rng = np.random.default_rng(1)
    return [{
        "returns": list(rng.normal(-800 + 100 * s, 50, size)), "best_return": -700 + 100 * s,
        "mean_return": -800 + 100 * s, "diversity": -10.0 + 2 * s,
        "train_diversity": -11.0 + 2 * s, "weight": [0.0, 0.5][s % 2], "arm": s % 2,
        "env_steps": (s + 1) * 1000,
    } for s in range(segments)]


def test_plot_cem_rl_draws_fitness_and_rl_vs_cem_actors():
    history = cem_rl_history()
    fig = plot_cem_rl(history)
    fitness_ax, roles_ax = fig.axes
    assert fitness_ax.get_ylabel() == "fitness (episode return)"
    assert len(fitness_ax.lines) == 4  # mean, elites, best, mean actor
    np.testing.assert_allclose(fitness_ax.lines[3].get_ydata(),
                               [record["mean_return"] for record in history])
    assert roles_ax.get_ylabel() == "fitness by role"
    assert [line.get_label() for line in roles_ax.lines] == ["RL actors (TD3 steps)",
                                                             "CEM actors"]
    # one dot per member and generation, split by role (a NaN one is an invisible dot)
    assert sum(len(c.get_offsets()) for c in roles_ax.collections) == 5 * 6
    assert roles_ax.get_xlabel() == "environment steps"
    assert "6 actors (3 RL), 5 generations" in fig._suptitle.get_text()


def test_plot_cem_rl_without_rl_actors_draws_only_the_cem_group():
    history = cem_rl_history()
    for record in history:
        record["rl_actor"] = [False] * 6
        record["rl_fitness"] = float("nan")
    _, roles_ax = plot_cem_rl(history).axes
    assert [line.get_label() for line in roles_ax.lines] == ["CEM actors"]


def test_plot_dvd_draws_diversity_returns_and_weight():
    history = dvd_history()
    fig = plot_dvd(history)
    diversity_ax, return_ax, weight_ax = fig.axes
    assert diversity_ax.get_ylabel() == "diversity (log-det)"
    np.testing.assert_allclose(diversity_ax.lines[0].get_ydata(), [-10, -8, -6, -4])
    assert return_ax.get_ylabel() == "episode return"
    assert len(return_ax.lines) == 3 + 2  # every member, best, mean
    assert weight_ax.get_ylabel() == "diversity weight"
    np.testing.assert_allclose(weight_ax.lines[0].get_ydata(), [0.0, 0.5, 0.0, 0.5])


@pytest.mark.parametrize("plot", [plot_cem_rl, plot_dvd])
def test_an_empty_history_is_refused(plot):
    with pytest.raises(ValueError, match="the history is empty"):
        plot([])
