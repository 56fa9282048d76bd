"""``minatar``: DiscoGen's MinAtar split at PureJaxRL's MinAtar PPO settings.

Meta-train on Breakout and Freeway, meta-test on Asterix and SpaceInvaders, as DiscoGen's
RL tasks fix it. Every game trains with PureJaxRL's MinAtar PPO (its notebook
``examples/brax_minatar.ipynb``): learning rate 5e-3 annealed to zero, 64 environments x
128 steps, 1e7 steps, 4 epochs x 8 minibatches, 64-64 ReLU networks, gamma 0.99, lambda
0.95, clip 0.2, entropy 0.01, value coefficient 0.5, gradient norm 0.5. GPU-sized: one
agent's 1e7 steps take minutes on a GPU and hours on a 2-core CPU.
"""

from metarl.suites.base import Suite, register_suite, same_settings

SOURCE = ("PureJaxRL MinAtar PPO (luchris429/purejaxrl, examples/brax_minatar.ipynb); split: "
          "DiscoGen (AlexGoldie/discogen, discobench_configs/OnPolicyRL_*.yaml)")
SETTINGS = {"num_envs": 64, "num_steps": 128, "total_timesteps": 10_000_000,
            "update_epochs": 4, "num_minibatches": 8, "hidden_sizes": [64, 64],
            "activation": "relu", "learning_rate": 5e-3, "anneal_lr": True,
            "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.01,
            "vf_coef": 0.5, "max_grad_norm": 0.5}


SUITE = register_suite(Suite(
    name="minatar", version=1,
    description="DiscoGen's MinAtar split: meta-train Breakout, Freeway; meta-test Asterix, "
                "SpaceInvaders (PureJaxRL settings, 1e7 steps; GPU-sized)",
    train=same_settings(("Breakout-MinAtar", "Freeway-MinAtar"), SETTINGS, SOURCE),
    test=same_settings(("Asterix-MinAtar", "SpaceInvaders-MinAtar"), SETTINGS, SOURCE),
    device="gpu"))
