"""Train a jitted, vmapped PPO over several population sizes; print one line per size.

Run in a subprocess by ``tests/test_population.py``, whose test fails if this does not finish
in time. Background: under jax 0.10.2 on the CPU, the
PureJaxRL PPO vmapped over 2 or 16 seeds never returned from ``block_until_ready`` (1 and 8
seeds did); jax is pinned to 0.9.2 for that reason, and this script guards the pin.

Usage: ``python tests/_hang_guard.py [SIZE ...]`` (default sizes 2 3). Each finished size
prints ``size=<P> finite=<bool> value_loss=<float> seconds=<float>``; the last line is ``done``.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

from inner_loops import PPOConfig, make_train

SIZES = (2, 3)
# PureJaxRL's CartPole-v1 shapes (4 envs x 128 steps, 64x64 tanh, 4 epochs x 4 minibatches),
# the program that hung, but only two updates: the compiled program is the same size.
CONFIG = PPOConfig(total_timesteps=2 * 4 * 128)


def main(argv: list[str]) -> int:
    sizes = [int(arg) for arg in argv] or list(SIZES)
    train = make_train(CONFIG)
    print(f"jax={jax.__version__} devices={jax.devices()}", flush=True)
    for size in sizes:
        start = time.perf_counter()
        keys = jax.random.split(jax.random.PRNGKey(size), size)
        metrics = jax.block_until_ready(jax.jit(jax.vmap(train))(keys))
        finite = bool(np.all(np.asarray(metrics["finite"])))
        value_loss = float(np.mean(np.asarray(metrics["value_loss"])))
        seconds = time.perf_counter() - start
        print(f"size={size} finite={finite} value_loss={value_loss:.6g} seconds={seconds:.1f}",
              flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
