"""RL algorithms as pure functions of arrays; they know nothing about evolution.

Every algorithm implements the contract of :mod:`inner_loops.learner` (``init`` /
``advance`` / ``train``) and is found by name in :mod:`inner_loops.registry`.
"""

from inner_loops.dqn import DQNConfig
from inner_loops.envs import EnvSpec, available_envs, make_env, make_vec_env
from inner_loops.learner import Learner
from inner_loops.objective import LossInputs, LossTerm, Objective, ppo_objective
from inner_loops.population import (
    advance_population,
    broadcast_to_population,
    copy_member,
    init_population,
    select_members,
    set_member,
    stack_hyperparams,
    train_population,
)
from inner_loops.ppo import Hyperparams, PPOConfig, PPOState, compute_gae, make_train
from inner_loops.recurrent_ppo import RecurrentPPOConfig
from inner_loops.registry import (
    available_algorithms,
    get_algorithm,
    make_learner,
    register_algorithm,
)
from inner_loops.sac import SACConfig
from inner_loops.td3 import TD3Config

__all__ = [
    "DQNConfig",
    "EnvSpec",
    "Hyperparams",
    "Learner",
    "LossInputs",
    "LossTerm",
    "Objective",
    "PPOConfig",
    "PPOState",
    "RecurrentPPOConfig",
    "SACConfig",
    "TD3Config",
    "advance_population",
    "available_algorithms",
    "available_envs",
    "broadcast_to_population",
    "compute_gae",
    "copy_member",
    "get_algorithm",
    "init_population",
    "make_env",
    "make_learner",
    "make_train",
    "make_vec_env",
    "ppo_objective",
    "register_algorithm",
    "select_members",
    "set_member",
    "stack_hyperparams",
    "train_population",
]
