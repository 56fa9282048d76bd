"""``classic``: gymnax classic control and bsuite behaviour tests, sized for a 2-core CPU.

Every environment trains with its PPO settings from gymnax-blines
(``RobertTLange/gymnax-blines``, ``agents/<env>/ppo.yaml`` at commit 3f029d6: two 64-unit
ReLU layers, a constant learning rate of 5e-4, gamma 0.99, lambda 0.95, clip 0.2, entropy
0.01, value coefficient 0.5, and each environment's own environments, rollout length and
gradient-norm clip), at a budget far below the yaml's: chosen by calibration
(``metarl suites --calibrate classic``, record ``docs/results/suites/classic_calibration.json``)
so that PPO tuned over its grid is clearly below each environment's ceiling, where
objectives can still differ, and so that judging one objective on the whole suite fits a
CPU.

Meta-train on CartPole, Catch and UmbrellaChain (balance, a one-step credit assignment, a
delayed reward among noise); meta-test on Acrobot (swing-up under a time limit), Pendulum
(continuous actions), DeepSea (exploration) and DiscountingChain (which of five delays pays
most). Tried and left out (the calibration ladders of the first version): MountainCar,
whose gymnax-blines PPO needs 64 epochs a batch, too costly for judging on a CPU; FourRooms,
whose untrained policy already reaches the goal in most episodes and tuned PPO in all of
them at any CPU budget; SimpleBandit, where tuned PPO stayed at the untrained policy's 0.5.
"""

from metarl.suites.base import Suite, SuiteTask, register_suite

SOURCE = "gymnax-blines agents/{env}/ppo.yaml (3f029d6); budget from the calibration record"
COMMON = {"update_epochs": 4, "num_minibatches": 4, "hidden_sizes": [64, 64],
          "activation": "relu", "learning_rate": 5e-4, "anneal_lr": False, "gamma": 0.99,
          "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.01, "vf_coef": 0.5}
# env_id -> (environments, rollout length, gradient-norm clip, budget in steps)
SETTINGS = {
    "CartPole-v1": (8, 32, 0.5, 25_600),
    "Catch-bsuite": (16, 32, 1.0, 7_680),
    "UmbrellaChain-bsuite": (8, 32, 0.5, 10_240),
    "Acrobot-v1": (16, 32, 1.0, 35_840),
    "Pendulum-v1": (32, 16, 1.0, 102_400),
    "DeepSea-bsuite": (8, 32, 0.5, 25_600),
    "DiscountingChain-bsuite": (8, 32, 0.5, 5_120),
}
TRAIN = ("CartPole-v1", "Catch-bsuite", "UmbrellaChain-bsuite")
TEST = ("Acrobot-v1", "Pendulum-v1", "DeepSea-bsuite", "DiscountingChain-bsuite")
# the best return an episode can give (what calibration measures the room below)
CEILINGS = {"CartPole-v1": 500.0, "Catch-bsuite": 1.0, "UmbrellaChain-bsuite": 1.0,
            "Acrobot-v1": -60.0, "Pendulum-v1": -120.0, "DeepSea-bsuite": 0.99,
            "DiscountingChain-bsuite": 1.1}


def _task(env_id: str) -> SuiteTask:
    envs, steps, grad_norm, budget = SETTINGS[env_id]
    return SuiteTask(env_id, {"env_id": env_id, "num_envs": envs, "num_steps": steps,
                              "max_grad_norm": grad_norm, "total_timesteps": budget,
                              **COMMON},
                     SOURCE.format(env=env_id), ceiling=CEILINGS[env_id])


SUITE = register_suite(Suite(
    name="classic", version=1,
    description="gymnax classic control + bsuite, CPU-sized: meta-train CartPole, Catch, "
                "UmbrellaChain; meta-test Acrobot, Pendulum, DeepSea, DiscountingChain",
    train=tuple(_task(env_id) for env_id in TRAIN),
    test=tuple(_task(env_id) for env_id in TEST),
    calibration="docs/results/suites/classic_calibration.json"))
