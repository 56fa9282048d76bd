"""How the networks' dense products are arranged (``PPOConfig.matmul``): checked, ``auto``
resolved by backend, ``xla`` plain products that train as the CPU arrangement does to float
rounding, and the CPU's default the CPU arrangement bit for bit. Recurrent PPO takes the
choice too, and refuses the PPO choices it would ignore (``shuffle``, ``final_values``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import PPOConfig, linear, make_train, networks
from inner_loops.ppo import make_network, make_parts
from inner_loops.recurrent_ppo import RecurrentPPOConfig
from inner_loops.recurrent_ppo import make_network as make_recurrent_network
from metarl.config import ConfigError, build_inner

# CartPole cut at 8 steps, 2 agents x 3 updates: a short run whose numbers a float-rounding
# difference would change only slightly
TINY = PPOConfig(num_envs=2, num_steps=16, total_timesteps=3 * 2 * 16, num_minibatches=2,
                 hidden_sizes=(8,), env_params={"max_steps_in_episode": 8})


def test_the_choice_is_checked_and_the_error_names_field_and_choices():
    for config in (PPOConfig, RecurrentPPOConfig):
        with pytest.raises(ValueError, match=r"^matmul: got 'gpu'; allowed: auto, cpu, xla$"):
            config(matmul="gpu")
    with pytest.raises(ConfigError, match=r"^inner\.matmul: got 'gpu'; allowed: auto, cpu"):
        build_inner({"matmul": "gpu"}, "inner")
    with pytest.raises(ValueError, match=r"^matmul: got 'fast'"):
        linear.dot_general_for("float32", "fast")


def test_auto_is_the_cpu_arrangement_on_a_cpu_and_plain_products_elsewhere():
    assert linear.resolve_matmul("auto", "cpu") == "cpu"
    assert linear.resolve_matmul("auto", "gpu") == "xla"
    assert linear.resolve_matmul("auto", "tpu") == "xla"
    assert linear.resolve_matmul("cpu", "gpu") == "cpu"
    assert linear.resolve_matmul("xla", "cpu") == "xla"
    assert jax.default_backend() == "cpu"  # the suite's machine: auto keeps today's program
    spec = make_parts(TINY).vec_env.spec
    assert make_network(TINY, spec).matmul == "cpu"
    assert make_network(TINY.replace(matmul="xla"), spec).matmul == "xla"
    recurrent = RecurrentPPOConfig(num_envs=2, num_steps=16, total_timesteps=64,
                                   num_minibatches=2, matmul="xla")
    assert make_recurrent_network(recurrent, spec).matmul == "xla"
    assert make_recurrent_network(recurrent.replace(matmul="auto"), spec).matmul == "cpu"


def test_each_arrangement_gives_its_dot_general():
    assert linear.dot_general_for("float32", "cpu") is linear.dense_dot_general
    assert linear.dot_general_for("float32", "auto") is linear.dense_dot_general  # here
    assert linear.dot_general_for("bfloat16", "cpu") is linear.bfloat16_dense_dot_general
    assert linear.dot_general_for("float32", "xla") is jax.lax.dot_general
    assert linear.dot_general_for("bfloat16", "xla") is linear.xla_bfloat16_dot_general
    assert linear.dot_general_for("float32") is linear.dense_dot_general  # the default


def _gradient_program(matmul: str) -> str:
    """The lowered program of the actor-critic's parameter gradient, arranged by
    ``matmul``."""
    network = networks.ActorCritic(action_dim=2, discrete=True, obs_ndim=1,
                                   hidden_sizes=(16,), matmul=matmul)
    obs = jnp.ones((5, 4))
    params = network.init(jax.random.PRNGKey(0), obs)

    def loss(params):
        logits, _, value = network.apply(params, obs)
        return jnp.sum(jnp.tanh(logits)) + jnp.sum(value ** 2)  # needs every output

    return jax.jit(jax.grad(loss)).lower(params).as_text()


def test_xla_leaves_the_products_to_xla():
    """The CPU arrangement keeps a transposed copy behind an optimisation barrier before
    each wide weight gradient and unrolls the 4-wide first layer into multiply-adds; plain
    products have neither: every dense product is one ``dot_general``."""
    cpu, xla = _gradient_program("cpu"), _gradient_program("xla")
    assert "optimization_barrier" in cpu and "optimization_barrier" not in xla
    # 4 dense layers: per layer one forward, one kernel-gradient and (but the first) one
    # input-gradient product; the first layer's input gradient is not needed
    assert xla.count("stablehlo.dot_general") == 4 * 3 - 2
    assert cpu.count("stablehlo.dot_general") < xla.count("stablehlo.dot_general")


@pytest.mark.parametrize("k,n", [(4, 64), (64, 2), (64, 64)])
def test_plain_bfloat16_products_round_every_product_and_keep_the_kernel_gradient(k, n):
    """With ``matmul = "xla"`` in bfloat16 every product (narrow ones too) takes bfloat16
    operands, with float32 results; the kernel gradient stays a float32 product."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(5, 7, k)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(5, 7, n)), jnp.float32)

    def rounded(a):
        return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), np.float64)

    out = linear.plain_bfloat16_matmul(x, kernel)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, np.einsum("abk,kn->abn", rounded(x), rounded(kernel)),
                               rtol=1e-5, atol=1e-4)
    x_grad, kernel_grad = jax.grad(
        lambda x, w: jnp.sum(linear.plain_bfloat16_matmul(x, w) * cotangent), (0, 1))(x, kernel)
    assert x_grad.dtype == kernel_grad.dtype == jnp.float32
    np.testing.assert_allclose(
        x_grad, np.einsum("abn,kn->abk", rounded(cotangent), rounded(kernel)),
        rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        kernel_grad, np.einsum("abk,abn->kn", np.asarray(x, np.float64),
                               np.asarray(cotangent, np.float64)), rtol=1e-5, atol=1e-4)
    # a batched contraction is not a dense layer's: handed to lax.dot_general unchanged
    a, b = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
    batched = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(linear.xla_bfloat16_dot_general(a, b, batched),
                                  jax.lax.dot_general(a, b, batched))


@pytest.fixture(scope="module")
def trained():
    """The tiny config trained by each arrangement (and by the default), from the same
    keys."""
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    return {name: jax.device_get(jax.jit(jax.vmap(make_train(TINY.replace(matmul=name))))(
        keys)) for name in ("auto", "cpu", "xla")}


def test_the_default_on_a_cpu_is_the_cpu_arrangement_bit_for_bit(trained):
    for name, values in trained["cpu"].items():
        np.testing.assert_array_equal(trained["auto"][name], values, err_msg=name)


def test_plain_products_train_as_the_cpu_arrangement_to_float_rounding(trained):
    cpu, xla = trained["cpu"], trained["xla"]
    assert np.all(cpu["finite"]) and np.all(xla["finite"]) and np.all(cpu["episodes"] > 0)
    # the same actions were taken (rounding moved no argmax), so the same episodes ended
    np.testing.assert_array_equal(xla["episodes"], cpu["episodes"])
    np.testing.assert_array_equal(xla["episode_return"], cpu["episode_return"])
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        np.testing.assert_allclose(xla[name], cpu[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # ... and they are other programs, not the same one twice
    assert any(not np.array_equal(xla[name], cpu[name]) for name in ("value_loss", "entropy"))


# ------------------------------------------------ recurrent PPO: choices it does not take


@pytest.mark.parametrize(("field", "value", "only"), [
    ("shuffle", "permutation", "sort"),
    ("final_values", "in_rollout", "batched"),
    ("final_values", "none", "batched"),
])
def test_recurrent_ppo_refuses_the_ppo_choices_it_would_ignore(field, value, only):
    with pytest.raises(ValueError,
                       match=rf"^{field}: got '{value}'; recurrent PPO allows only '{only}' \("):
        RecurrentPPOConfig(**{field: value})
    with pytest.raises(ConfigError, match=rf"^inner\.{field}: got '{value}'; recurrent PPO"):
        build_inner({"algorithm": "recurrent_ppo", field: value}, "inner")
    # PPO takes it
    assert getattr(PPOConfig(**{field: value}), field) == value
