"""The tiny evolution experiment the run-directory tests start, kill and resume: a few
seconds per generation on a CPU, with every checkpoint kept long enough to damage."""

from pathlib import Path

GENERATIONS = 5
TINY = f"""
name = "tiny"
[objective]
name = "value_distance"
options = {{ hidden_sizes = [8] }}
[inner]
env_id = "CartPole-v1"
num_envs = 4
num_steps = 32
total_timesteps = 4096
hidden_sizes = [16]
update_epochs = 2
num_minibatches = 2
[es]
population_size = 4
generations = {GENERATIONS}
sigma = 0.05
[fitness]
seeds_per_candidate = 2
[run]
checkpoint_every = 1
keep_checkpoints = 2
progress = false
"""
KILL_WORKER = Path(__file__).parent / "_kill_worker.py"
