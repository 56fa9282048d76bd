"""RL algorithms as pure functions of arrays; they know nothing about evolution."""

from inner_loops.envs import EnvSpec, available_envs, make_env, make_vec_env
from inner_loops.objective import LossInputs, LossTerm, Objective, ppo_objective
from inner_loops.ppo import (
    Hyperparams,
    PPOConfig,
    broadcast_to_population,
    compute_gae,
    make_train,
    stack_hyperparams,
    train_population,
)

__all__ = [
    "EnvSpec",
    "Hyperparams",
    "LossInputs",
    "LossTerm",
    "Objective",
    "PPOConfig",
    "available_envs",
    "broadcast_to_population",
    "compute_gae",
    "make_env",
    "make_train",
    "make_vec_env",
    "ppo_objective",
    "stack_hyperparams",
    "train_population",
]
