"""A learned advantage transformation for PPO, as a researcher would write it in their own file.

PPO's clipped surrogate sees the advantage through a learned, sign-preserving reweighting
``f(A) = A * exp(g(A))``, with ``g(A) = MLP(A) - MLP(0)``; the network's output layer starts at
zero, so the search starts at exactly PPO. Name this file in an experiment with
``[objective] module = "advantage_transform.py"`` (a path relative to the experiment file).
"""

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

from inner_loops.objective import LossInputs, LossTerm, Objective, ppo_clip_surrogate
from metarl.objectives.mlp import apply_mlp, init_mlp
from metarl.objectives.registry import register_objective


def transformed(meta_params: dict, advantages: jax.Array) -> jax.Array:
    """``f(A) = A exp(g(A))`` elementwise over ``advantages [...]``."""
    net = apply_mlp(meta_params, advantages[..., None])[..., 0]
    at_zero = apply_mlp(meta_params, jnp.zeros((1,), jnp.float32))[0]
    return advantages * jnp.exp(jnp.clip(net - at_zero, -5.0, 5.0))


def plot(request) -> dict:
    """``metarl plot``: f(A) of each saved candidate beside the identity."""
    advantages = jnp.linspace(-3.0, 3.0, 121)
    figure, axis = plt.subplots(figsize=(5, 3.5))
    axis.plot(advantages, advantages, "k--", label="PPO: f(A) = A")
    for which, meta_params in request.candidates.items():
        axis.plot(advantages, transformed(meta_params["policy"], advantages),
                  label=request.label(which))
    axis.set(xlabel="advantage A", ylabel="f(A)", title=request.run_name)
    axis.legend()
    return {"advantage_transform": figure}


@register_objective("advantage_transform", slots=("policy",), algorithms=("ppo",),
                    baselines=("ppo",), plot=plot)
def make_advantage_transform(hidden_sizes: tuple[int, ...] = (16,)) -> Objective:
    """PPO's clipped surrogate on learned advantages f(A) = A exp(g(A))."""
    sizes = (1, *hidden_sizes, 1)

    def init(key: jax.Array) -> dict:
        return init_mlp(key, sizes, zero_last=True)

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        advantages = transformed(meta_params, inputs.advantages)
        return -jnp.mean(ppo_clip_surrogate(inputs.ratio, advantages, inputs.clip_eps))

    return Objective(policy=LossTerm("advantage_transform", init, loss))
