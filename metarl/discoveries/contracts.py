"""What each slot of a discovery reads: its inputs' meaning, shapes, and where the algorithm
computes them, so that a discovery used outside metarl is fed what it was evolved on.

:func:`slot_contracts` gives, per filled slot, the plain function :func:`metarl.load_objective`
returns (``function``), each input (``inputs``: meaning, shape, where it comes from), what
the function returns (``output``) and how the algorithm uses it (``used_as``). Objectives
named in :data:`CONTRACTS` have their own; any other policy or value slot is described as
its loss of :class:`~inner_loops.objective.LossInputs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VALUE_ERROR = {
    "x": {"meaning": "x = value - target: the critic's prediction minus its regression "
                     "target, per sample",
          "shape": "[...] (elementwise; any shape)",
          "computed": "PPO: the critic's prediction under the current parameters minus the "
                      "GAE target (GAE advantage + the value predicted at rollout time), per "
                      "sample of a minibatch, not clipped; off-policy critics (TD3, SAC, "
                      "DQN): the Q-value minus the bootstrapped TD target"},
}
RATIO_ADVANTAGE = {
    "ratio": {"meaning": "probability ratio pi_new(a|s) / pi_old(a|s) of the taken action",
              "shape": "[...] (> 0; broadcasts with advantage)",
              "computed": "PPO: exp(log pi_new - log pi_old) per sample of a minibatch, "
                          "pi_old the policy that collected the rollout"},
    "advantage": {"meaning": "GAE advantage, normalised per minibatch (zero mean, unit "
                             "standard deviation) when the run's normalize_advantages is on",
                  "shape": "[...] (broadcasts with ratio)",
                  "computed": "PPO: GAE(gamma, gae_lambda) over the rollout, normalised over "
                              "each minibatch"},
}
PROGRESS = {
    "progress": {"meaning": "training progress n / N: updates done over the run's updates",
                 "shape": "[] or [...] (broadcasts), in [0, 1)",
                 "computed": "PPO: update index / number of updates, the same for every "
                             "sample of an update"},
}
DRIFT_OUTPUT = ("drift >= 0, [...] the broadcast shape; zero with zero gradient at ratio = 1")
DRIFT_USE = "PPO's policy loss -mean(ratio * advantage - drift)"
OPTIMIZER_INPUTS = {
    "grads": {"meaning": "the gradient of PPO's loss with respect to the agent's parameters, "
                         "after clipping by global norm (max_grad_norm)",
              "shape": "a pytree like the parameters",
              "computed": "PPO: per minibatch, jax.grad of the total loss"},
    "progress": {"meaning": "the extra argument progress=: fraction of training done n / N",
                 "shape": "[] float32 in [0, 1]", "computed": "PPO: update / num_updates"},
    "key": {"meaning": "the extra argument key=: a fresh PRNG key each step (stochastic "
                       "rules draw noise from it; deterministic ones ignore it)",
            "shape": "a jax.random key", "computed": "PPO: split from the agent's own key"},
}
OPTIMIZER_USE = ("where Adam's scale_by_adam sits: params <- params - learning_rate * u, u "
                 "the rule's output; its state from init(params) is kept across steps")

CONTRACTS: dict[tuple[str, str], dict[str, Any]] = {
    ("value_distance", "value"): {
        "function": "d(x)", "inputs": VALUE_ERROR,
        "output": "d(x) >= 0, [...] the shape of x (the learned overall scale included)",
        "used_as": "the critic's loss mean(d(x)) over the batch, weighted by vf_coef in PPO"},
    ("l2", "value"): {
        "function": "d(x)", "inputs": VALUE_ERROR, "output": "0.5 x^2, [...]",
        "used_as": "the critic's loss mean(d(x))"},
    ("huber", "value"): {
        "function": "d(x)", "inputs": VALUE_ERROR, "output": "Huber of x (threshold 1), [...]",
        "used_as": "the critic's loss mean(d(x))"},
    ("lpo", "policy"): {
        "function": "drift(ratio, advantage)", "inputs": RATIO_ADVANTAGE,
        "output": DRIFT_OUTPUT, "used_as": DRIFT_USE},
    ("dpo", "policy"): {
        "function": "drift(ratio, advantage)", "inputs": RATIO_ADVANTAGE,
        "output": DRIFT_OUTPUT, "used_as": DRIFT_USE},
    ("ta_lpo", "policy"): {
        "function": "drift(ratio, advantage, progress)",
        "inputs": {**RATIO_ADVANTAGE, **PROGRESS}, "output": DRIFT_OUTPUT,
        "used_as": DRIFT_USE},
    ("learned_optimizer", "optimizer"): {
        "function": "optax.GradientTransformationExtraArgs: update(grads, state, params, *, "
                    "progress, key)",
        "inputs": OPTIMIZER_INPUTS, "output": "updates u, a pytree like grads",
        "used_as": OPTIMIZER_USE},
    ("open_optimizer", "optimizer"): {
        "function": "optax.GradientTransformationExtraArgs: update(grads, state, params, *, "
                    "progress, key)",
        "inputs": OPTIMIZER_INPUTS,
        "output": "updates u, a pytree like grads (with learned noise drawn from key)",
        "used_as": OPTIMIZER_USE},
}

GENERIC = {
    "policy": {"function": "loss(LossInputs) -> []",
               "inputs": {"LossInputs": {
                   "meaning": "ratio, log_ratio, advantages (normalised per minibatch), "
                              "clip_eps, progress: see inner_loops.objective.LossInputs",
                   "shape": "[B] per field, clip_eps and progress []",
                   "computed": "PPO, per minibatch"}},
               "output": "the policy loss, a scalar to minimise", "used_as": "PPO's policy loss"},
    "value": {"function": "loss(LossInputs) -> []",
              "inputs": {"LossInputs": {
                  "meaning": "values, old_values, targets, clip_eps: see "
                             "inner_loops.objective.LossInputs",
                  "shape": "[B] per field, clip_eps []",
                  "computed": "PPO per minibatch (targets: GAE targets); off-policy critics "
                              "(targets: bootstrapped TD targets)"}},
              "output": "the critic's loss, a scalar to minimise",
              "used_as": "the critic's loss"},
    "optimizer": {"function": "optax.GradientTransformationExtraArgs",
                  "inputs": OPTIMIZER_INPUTS, "output": "updates u, a pytree like grads",
                  "used_as": OPTIMIZER_USE},
}


def slot_contracts(objective: str, slots: tuple[str, ...], inner: Mapping[str, Any]
                   ) -> dict[str, dict[str, Any]]:
    """``{slot: contract}`` for each slot ``objective`` fills, with the algorithm
    (``inner["algorithm"]``) and the settings that shape the inputs (``clip_eps``,
    ``normalize_advantages``, ``gamma``, ``gae_lambda``, ``max_grad_norm``) where the run's
    first ``[inner]`` table has them."""
    settings = {name: inner[name] for name in ("clip_eps", "normalize_advantages", "gamma",
                                               "gae_lambda", "max_grad_norm") if name in inner}
    return {slot: {**CONTRACTS.get((objective, slot), GENERIC[slot]),
                   "algorithm": inner.get("algorithm"), "settings": settings}
            for slot in slots}
