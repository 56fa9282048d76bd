"""The matrix product of a dense layer, arranged for XLA's CPU backend.

Under ``vmap`` over a population, every layer's product becomes a batched dot, which XLA's
CPU backend runs through Eigen one agent at a time. That is efficient for the 64x64 hidden
layers but not when the contracted or the produced width is tiny: the first layer contracts
over CartPole's 4 observations, and the policy head's backward pass contracts over its 2
logits. A profile of ``jit(vmap(train))`` at 32 agents showed the head's input-gradient dot
(``[32,128,2] x [32,64,2]``) taking longer than the 64x64 forward dot with 32 times its
FLOPs. Written as a few broadcast multiply-adds instead, such a product becomes one fused
elementwise loop. A
narrow output (the policy and value heads) is computed, and its kernel gradient taken, one
output column at a time, as matrix-vector products.

:func:`dense_dot_general` has the signature of :func:`jax.lax.dot_general` and is passed to
``flax.linen.Dense(dot_general=...)``: the layer's parameters, initialisation and results are
unchanged (up to float rounding); only the arrangement of the arithmetic differs.
Reverse-mode differentiation (``jax.grad``) is supported; forward mode (``jax.jvp``) is not,
as for any :func:`jax.custom_vjp` function.

Mixed precision: :func:`dot_general_for` ``("bfloat16")`` gives a variant whose wide
products (the forward pass and the input gradient) take bfloat16 operands and produce
float32 results; parameters, their gradients (weight-gradient products stay float32),
optimiser state and losses stay float32. The narrow, unrolled products stay float32: they
are elementwise loops whose cost does not depend on the operands' width.

The arrangement is a choice (:data:`MATMULS`, :func:`resolve_matmul`): ``"cpu"`` is the
one above, ``"xla"`` hands every product to XLA as one plain ``dot_general`` (flax's own
default; with bfloat16, :func:`plain_bfloat16_matmul`), and ``"auto"`` is ``"cpu"`` on a
CPU and ``"xla"`` elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

# Contractions over at most this many elements are unrolled into broadcast multiply-adds,
# and outputs this narrow are produced column by column. Widths 4 and 2 (CartPole's
# observations and logits) and 1 (the value) gain from it (benchmarks/compare_revisions.py);
# 64x64 products stay batched dots.
SMALL_WIDTH = 8

PRECISIONS = ("float32", "bfloat16")
MATMULS = ("auto", "cpu", "xla")


def _sum_of_products(a: jax.Array, rows: jax.Array) -> jax.Array:
    """``a @ rows`` as ``sum_k a[..., k] * rows[k]``: ``[..., K] x [K, N] -> [..., N]``."""
    total = a[..., 0:1] * rows[0]
    for k in range(1, a.shape[-1]):
        total = total + a[..., k : k + 1] * rows[k]
    return total


def _dot(a: jax.Array, b: jax.Array, a_axis: int, b_axis: int,
         bfloat16: bool = False) -> jax.Array:
    dimension_numbers = (((a_axis,), (b_axis,)), ((), ()))
    if bfloat16:
        return lax.dot_general(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                               dimension_numbers, preferred_element_type=jnp.float32)
    return lax.dot_general(a, b, dimension_numbers)


def _by_columns(product, columns: int) -> jax.Array:
    """``stack([product(n) for n in range(columns)], axis=-1)``."""
    return jnp.stack([product(n) for n in range(columns)], axis=-1)


def _forward(x: jax.Array, kernel: jax.Array, bfloat16: bool) -> jax.Array:
    if kernel.shape[0] <= SMALL_WIDTH:
        return _sum_of_products(x, kernel)
    if kernel.shape[1] <= SMALL_WIDTH:
        # matrix-vector products, one per output: under vmap faster than one batched dot
        # with a narrow output (benchmarks/compare_revisions.py measures such choices)
        return _by_columns(lambda n: _dot(x, kernel[:, n], x.ndim - 1, 0), kernel.shape[1])
    return _dot(x, kernel, x.ndim - 1, 0, bfloat16)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x: jax.Array, kernel: jax.Array, bfloat16: bool = False) -> jax.Array:
    """``x @ kernel`` for ``x [..., K]`` and ``kernel [K, N]``, returning ``[..., N]``;
    with ``bfloat16`` the wide products take bfloat16 operands (float32 results)."""
    return _forward(x, kernel, bfloat16)


def _matmul_fwd(x, kernel, bfloat16):
    return _forward(x, kernel, bfloat16), (x, kernel)


def _matmul_bwd(bfloat16, residuals, cotangent):
    x, kernel = residuals
    # d x = cotangent @ kernel.T: [..., N] x [N, K] -> [..., K]
    if kernel.shape[1] <= SMALL_WIDTH:
        x_grad = _sum_of_products(cotangent, kernel.T)
    else:
        x_grad = _dot(cotangent, kernel, cotangent.ndim - 1, 1, bfloat16)
    # d kernel = x.T @ cotangent, contracted over every leading axis: [K, N]
    leading = tuple(range(x.ndim - 1))
    over_leading = ((leading, leading), ((), ()))
    if kernel.shape[1] <= SMALL_WIDTH:
        # as in the forward pass, one matrix-vector product per output column
        kernel_grad = _by_columns(
            lambda n: lax.dot_general(x, cotangent[..., n], over_leading), kernel.shape[1]
        )
    else:
        kernel_grad = _transposed_product(x, cotangent)
    return x_grad, kernel_grad


def _transposed_product(x: jax.Array, cotangent: jax.Array) -> jax.Array:
    """``x.T @ cotangent`` over every leading axis: ``[..., K] x [..., N] -> [K, N]``.

    Written as one ``dot_general`` contracting the leading axes, XLA's CPU backend hands
    Eigen an operand whose contracted axis is not the contiguous one, and under ``vmap`` it
    runs that batched dot on one thread, well below the forward product's speed.
    Transposing ``x`` into a ``[K, M]`` array first (kept as a copy by the optimisation
    barrier, which stops XLA from folding the transpose back into the dot) makes it an
    ordinary ``[K, M] x [M, N]`` product (``benchmarks/compare_revisions.py``).
    """
    rows = x.reshape(-1, x.shape[-1])
    columns = cotangent.reshape(-1, cotangent.shape[-1])
    x_transposed = lax.optimization_barrier(rows.T)
    return _dot(x_transposed, columns, 1, 0)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _is_dense_case(lhs, rhs, dimension_numbers, precision, preferred_element_type) -> bool:
    (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
    return (
        rhs.ndim == 2
        and tuple(lhs_contracting) == (lhs.ndim - 1,)
        and tuple(rhs_contracting) == (0,)
        and not lhs_batch
        and not rhs_batch
        and precision is None
        and preferred_element_type is None
    )


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """Drop-in for :func:`jax.lax.dot_general` in ``flax.linen.Dense``.

    Dense contracts the input's last axis with the kernel's first, with no batch axes; that
    case goes to :func:`matmul`. Anything else (and any explicit precision or output type)
    is handed to :func:`jax.lax.dot_general` unchanged.
    """
    if _is_dense_case(lhs, rhs, dimension_numbers, precision, preferred_element_type):
        return matmul(lhs, rhs)
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)


def bfloat16_dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                               preferred_element_type=None):
    """:func:`dense_dot_general` with the wide products in bfloat16 (float32 results)."""
    if _is_dense_case(lhs, rhs, dimension_numbers, precision, preferred_element_type):
        return matmul(lhs, rhs, True)
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)


@jax.custom_vjp
def plain_bfloat16_matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x @ kernel`` (``[..., K] x [K, N] -> [..., N]``) as one ``dot_general`` of bfloat16
    operands with a float32 result, whatever the widths; its input gradient is one such
    product too, and its kernel gradient one float32 ``dot_general`` over every leading
    axis (the precision contract of :func:`matmul`, without its arrangement)."""
    return _dot(x, kernel, x.ndim - 1, 0, True)


def _plain_bfloat16_fwd(x, kernel):
    return plain_bfloat16_matmul(x, kernel), (x, kernel)


def _plain_bfloat16_bwd(residuals, cotangent):
    x, kernel = residuals
    leading = tuple(range(x.ndim - 1))
    kernel_grad = lax.dot_general(x, cotangent, ((leading, leading), ((), ())))
    return _dot(cotangent, kernel, cotangent.ndim - 1, 1, True), kernel_grad


plain_bfloat16_matmul.defvjp(_plain_bfloat16_fwd, _plain_bfloat16_bwd)


def xla_bfloat16_dot_general(lhs, rhs, dimension_numbers, precision=None,
                             preferred_element_type=None):
    """``lax.dot_general`` for ``flax.linen.Dense`` with the dense case in bfloat16
    operands (:func:`plain_bfloat16_matmul`); anything else is handed on unchanged."""
    if _is_dense_case(lhs, rhs, dimension_numbers, precision, preferred_element_type):
        return plain_bfloat16_matmul(lhs, rhs)
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)


def resolve_matmul(choice: str, backend: str | None = None) -> str:
    """What ``matmul = choice`` (one of :data:`MATMULS`) means on ``backend`` (default
    ``jax.default_backend()``): ``"cpu"`` or ``"xla"``.

    ``"auto"`` is ``"cpu"`` on a CPU, where the arrangement above was measured faster
    (Eigen runs a batched dot with a tiny contracted or produced width, or a contraction
    over a non-contiguous axis, far below its speed). Elsewhere it is ``"xla"``: a GPU's
    dot kernels take narrow and transposed operands as they come, while the arrangement
    reads and writes more memory there (its unrolled multiply-adds and per-column
    products materialise intermediates, and the optimisation barrier keeps a transposed
    copy of every weight gradient's input): on SpaceInvaders-MinAtar 155k against 129k
    bytes per agent-step in the minibatch steps (``benchmarks/step_cost.py``).
    """
    if choice not in MATMULS:
        raise ValueError(f"matmul: got {choice!r}; allowed: {', '.join(MATMULS)}")
    if choice != "auto":
        return choice
    return "cpu" if (backend or jax.default_backend()) == "cpu" else "xla"


def dot_general_for(precision: str, matmul: str = "cpu"):
    """The ``dot_general`` of a dense layer for ``precision`` (one of :data:`PRECISIONS`)
    arranged by ``matmul`` (one of :data:`MATMULS`; ``"auto"`` resolved here by
    :func:`resolve_matmul`). ``"xla"`` in float32 is :func:`jax.lax.dot_general` itself."""
    arrangement = resolve_matmul(matmul)
    if precision == "float32":
        return dense_dot_general if arrangement == "cpu" else lax.dot_general
    if precision == "bfloat16":
        return (bfloat16_dense_dot_general if arrangement == "cpu"
                else xla_bfloat16_dot_general)
    raise ValueError(f"precision: got {precision!r}; allowed: {', '.join(PRECISIONS)}")
