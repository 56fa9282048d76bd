"""The dense-layer product: same values and gradients as ``x @ kernel``, in every width case."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inner_loops import linear

# (K, N): small contraction (first layer), small output (policy head), both wide, both small
SHAPES = [(4, 64), (64, 2), (64, 64), (3, 1)]


def _inputs(k, n, batch=(5, 7), seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(*batch, k)), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(*batch, n)), jnp.float32)
    return x, kernel, cotangent


@pytest.mark.parametrize("k,n", SHAPES)
def test_matmul_values_and_gradients_equal_the_plain_product(k, n):
    x, kernel, cotangent = _inputs(k, n)
    expected = np.einsum("abk,kn->abn", np.asarray(x, np.float64), np.asarray(kernel, np.float64))
    np.testing.assert_allclose(linear.matmul(x, kernel), expected, rtol=1e-5, atol=1e-5)

    def loss(fn):
        return lambda x, kernel: jnp.sum(fn(x, kernel) * cotangent)

    got = jax.grad(loss(linear.matmul), argnums=(0, 1))(x, kernel)
    want = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, kernel)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,n", [(4, 64), (64, 2), (64, 64)])
def test_matmul_under_vmap_matches_per_agent_products(k, n):
    population = 3
    xs, kernels, cotangents = zip(*(_inputs(k, n, seed=s) for s in range(population)),
                                  strict=True)
    xs, kernels, cotangents = map(jnp.stack, (xs, kernels, cotangents))

    def grads(x, kernel, cotangent):
        return jax.grad(lambda x, w: jnp.sum(linear.matmul(x, w) * cotangent), (0, 1))(x, kernel)

    batched = jax.jit(jax.vmap(grads))(xs, kernels, cotangents)
    for i in range(population):
        def plain_loss(x, w, cotangent=cotangents[i]):
            return jnp.sum((x @ w) * cotangent)

        single = jax.grad(plain_loss, (0, 1))(xs[i], kernels[i])
        for b, s in zip(batched, single, strict=True):
            np.testing.assert_allclose(b[i], s, rtol=1e-5, atol=1e-5)


def test_dense_layer_with_it_equals_flax_default():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 4)), jnp.float32)
    plain, fast = nn.Dense(2), nn.Dense(2, dot_general=linear.dense_dot_general)
    params = plain.init(jax.random.PRNGKey(0), x)
    assert jax.tree.structure(params) == jax.tree.structure(fast.init(jax.random.PRNGKey(0), x))
    np.testing.assert_allclose(fast.apply(params, x), plain.apply(params, x), rtol=1e-5, atol=1e-6)


def test_other_contractions_fall_back_to_lax_dot_general():
    a = jnp.arange(24.0).reshape(2, 3, 4)
    b = jnp.arange(40.0).reshape(2, 4, 5)
    batched = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(
        linear.dense_dot_general(a, b, batched), jax.lax.dot_general(a, b, batched)
    )
    x, kernel, _ = _inputs(4, 3)
    highest = linear.dense_dot_general(x, kernel, (((2,), (0,)), ((), ())),
                                       precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(highest, x @ kernel, rtol=1e-5, atol=1e-5)


def _bfloat16_rounded(a):
    return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


@pytest.mark.parametrize("k,n", SHAPES)
def test_bfloat16_products_round_only_the_operands_of_wide_products(k, n):
    """Products in bfloat16 equal float64 products of bfloat16-rounded operands (float32
    results): the forward product when both widths are wide, the input gradient when the
    output is wide; the rest, and the kernel gradient, equal the float32 ones."""
    x, kernel, cotangent = _inputs(k, n)
    wide_output = n > linear.SMALL_WIDTH

    def reference(a, b, rounded):
        a, b = (_bfloat16_rounded(a), _bfloat16_rounded(b)) if rounded else (
            np.asarray(a, np.float64), np.asarray(b, np.float64))
        return np.einsum("abk,kn->abn", a, b)

    out = linear.matmul(x, kernel, True)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference(x, kernel, k > linear.SMALL_WIDTH and wide_output),
                               rtol=1e-5, atol=1e-4)

    def loss(bfloat16):
        return lambda x, kernel: jnp.sum(linear.matmul(x, kernel, bfloat16) * cotangent)

    x_grad, kernel_grad = jax.grad(loss(True), argnums=(0, 1))(x, kernel)
    want_kernel = jax.grad(loss(False), argnums=1)(x, kernel)
    assert x_grad.dtype == kernel_grad.dtype == jnp.float32
    np.testing.assert_allclose(kernel_grad, want_kernel, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x_grad, reference(cotangent, kernel.T, wide_output),
                               rtol=1e-5, atol=1e-4)
    if wide_output:  # really rounded: far from the float32 product at this tolerance
        assert not np.allclose(x_grad, reference(cotangent, kernel.T, False), rtol=1e-5,
                               atol=1e-5)


def test_a_bfloat16_dense_layer_keeps_float32_parameters_and_outputs():
    x = jnp.asarray(np.random.default_rng(2).normal(size=(8, 64)), jnp.float32)
    layer = nn.Dense(64, dot_general=linear.dot_general_for("bfloat16"))
    params = layer.init(jax.random.PRNGKey(0), x)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    out = layer.apply(params, x)
    assert out.dtype == jnp.float32
    text = jax.jit(layer.apply).lower(params, x).as_text()
    assert "bf16" in text
    plain = nn.Dense(64).apply(params, x)
    np.testing.assert_allclose(out, plain, rtol=5e-2, atol=5e-2)
    with pytest.raises(ValueError, match="precision: got 'float16'"):
        linear.dot_general_for("float16")
