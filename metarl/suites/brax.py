"""``brax``: meta-train on ant, meta-test on other locomotion tasks, GPU-sized.

LPO was meta-trained on one Brax task and tested on others; this suite asks the same of any
PPO objective. Every task trains with PureJaxRL's Brax PPO (``purejaxrl/ppo_continuous_action.py``):
2048 environments x 10 steps, 5e7 steps, 4 epochs x 32 minibatches, 256-256 tanh networks,
learning rate 3e-4 (not annealed), gamma 0.99, lambda 0.95, clip 0.2, no entropy bonus,
value coefficient 0.5, gradient norm 0.5, observation and reward normalisation.
"""

from metarl.suites.base import Suite, register_suite, same_settings

SOURCE = "PureJaxRL Brax PPO (luchris429/purejaxrl, purejaxrl/ppo_continuous_action.py)"
SETTINGS = {"num_envs": 2048, "num_steps": 10, "total_timesteps": 50_000_000,
            "update_epochs": 4, "num_minibatches": 32, "hidden_sizes": [256, 256],
            "activation": "tanh", "learning_rate": 3e-4, "anneal_lr": False,
            "normalize_obs": True, "normalize_reward": True, "gamma": 0.99,
            "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.0, "vf_coef": 0.5,
            "max_grad_norm": 0.5}


SUITE = register_suite(Suite(
    name="brax", version=1,
    description="Brax locomotion: meta-train ant; meta-test halfcheetah, hopper, walker2d, "
                "humanoid (PureJaxRL settings, 5e7 steps; GPU-sized)",
    train=same_settings(("brax/ant",), SETTINGS, SOURCE),
    test=same_settings(("brax/halfcheetah", "brax/hopper", "brax/walker2d", "brax/humanoid"),
                       SETTINGS, SOURCE),
    device="gpu", modules=("brax",)))
