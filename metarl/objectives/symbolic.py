"""Closed-form objectives written as expressions: a value distance ``d(x)`` or a drift
``D(r, A, p)``, e.g. a formula distilled from an evolved network (``metarl distill``).

Two registered objectives, because a registered objective fills fixed slots:

* ``"symbolic"`` fills the value slot with ``L_v = mean_i d(v_i - t_i)``; its option
  ``value`` is ``d`` as a function of ``x`` (the error ``value - target``), e.g.
  ``value = "0.5*x**2"`` is the plain L2 loss. Any algorithm with a critic.
* ``"symbolic_drift"`` fills PPO's policy slot with ``L_pi = -mean_i (r_i A_i - D_i)``, as
  LPO and DPO do; its option ``drift`` is ``D`` as a function of ``r`` (the probability
  ratio), ``A`` (the advantage as the loss sees it, normalised per minibatch when PPO
  normalises) and ``p`` (training progress ``n / N``), e.g.
  ``drift = "Max(0, (r - 1)*A - 2*tanh((r - 1)*A/2))"``.

The expression is used as written: nothing is added to make ``d(0) = 0``, ``D >= 0`` or
``D(1, A) = 0`` hold (the distiller builds its formulas so that they do).

Expressions are parsed with sympy and may use only their variables, numbers, ``+ - * / **``,
the constants ``pi`` and ``E``, and the functions of :data:`FUNCTIONS` (``relu(u)`` is
``Max(u, 0)``); anything else is a ``ValueError`` naming it. They compile to plain
``jax.numpy`` operations (:func:`compile_expression`), traced into the training program like
any loss: no Python callback runs while training. There are no meta-parameters
(``{"policy": {}, "value": {}}``), so a run evaluates such an objective as a fixed one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from inner_loops.objective import LossInputs, LossTerm, Objective, no_meta_params
from metarl.objectives.registry import LEARNING_RATE, VF_COEF, register_objective

VALUE_VARIABLES = ("x",)
DRIFT_VARIABLES = ("r", "A", "p")
FUNCTIONS = ("exp", "log", "tanh", "sqrt", "Abs", "Max", "Min", "sign", "relu", "cosh",
             "sinh", "Heaviside")
CONSTANTS = ("pi", "E")


def parse_expression(text: str, variables: Sequence[str]):
    """``text`` as a sympy expression in ``variables`` (names of real symbols).

    Raises:
        ValueError: not a string, not parseable, or using a name that is neither one of
            ``variables``, a constant of :data:`CONSTANTS` nor a function of
            :data:`FUNCTIONS` (the message names it and lists what is allowed).
    """
    import sympy
    from sympy.parsing.sympy_parser import parse_expr, standard_transformations

    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"an expression must be a non-empty string, got {text!r}")
    symbols = {name: sympy.Symbol(name, real=True) for name in variables}
    functions = {name: getattr(sympy, name) for name in FUNCTIONS if name != "relu"}
    functions["relu"] = lambda u: sympy.Max(u, 0)
    functions["abs"] = sympy.Abs
    constants = {"pi": sympy.pi, "E": sympy.E}
    namespace = {"Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational,
                 "Symbol": sympy.Symbol, "Function": sympy.Function, "__builtins__": {}}
    allowed = (f"variables {', '.join(variables)}; constants {', '.join(CONSTANTS)}; "
               f"functions {', '.join(FUNCTIONS)}")
    try:
        expression = parse_expr(text, local_dict={**symbols, **functions, **constants},
                                global_dict=namespace,
                                transformations=standard_transformations, evaluate=True)
    except Exception as error:  # sympy raises many kinds for malformed text
        raise ValueError(f"cannot parse expression {text!r}: {error}; allowed: "
                         f"{allowed}") from None
    if not isinstance(expression, sympy.Expr):
        raise ValueError(f"expression {text!r} is not a number-valued expression")
    unknown = sorted(str(s) for s in expression.free_symbols
                     if str(s) not in variables or s != symbols[str(s)])
    if unknown:
        raise ValueError(f"expression {text!r} uses unknown name(s) {', '.join(unknown)}; "
                         f"allowed: {allowed}")
    undefined = sorted({type(f).__name__ for f in expression.atoms(sympy.Function)
                        if isinstance(f, sympy.core.function.AppliedUndef)})
    if undefined:
        raise ValueError(f"expression {text!r} uses unknown function(s) "
                         f"{', '.join(undefined)}; allowed: {allowed}")
    if expression.has(sympy.I, sympy.zoo, sympy.oo, sympy.nan):
        raise ValueError(f"expression {text!r} is not real and finite")
    return expression


def _jax_of(expression, arguments: dict[str, jax.Array]) -> jax.Array:
    """``expression`` (sympy) evaluated with ``jax.numpy`` on ``arguments`` (name -> array)."""
    import sympy

    def walk(node):
        if node.is_Symbol:
            return arguments[node.name]
        if node.is_Number or node in (sympy.pi, sympy.E):
            return jnp.float32(float(node))
        args = [walk(a) for a in node.args]
        if node.is_Add:
            total = args[0]
            for a in args[1:]:
                total = total + a
            return total
        if node.is_Mul:
            product = args[0]
            for a in args[1:]:
                product = product * a
            return product
        if node.is_Pow:
            exponent = node.args[1]
            if exponent.is_Integer:  # lax.integer_pow: x**2 is exactly jnp.square(x)
                return jax.lax.integer_pow(args[0], int(exponent))
            if exponent == sympy.Rational(1, 2):
                return jnp.sqrt(args[0])
            return jnp.power(args[0], args[1])
        unary = {sympy.exp: jnp.exp, sympy.log: jnp.log, sympy.tanh: jnp.tanh,
                 sympy.Abs: jnp.abs, sympy.sign: jnp.sign, sympy.cosh: jnp.cosh,
                 sympy.sinh: jnp.sinh}
        if node.func in unary:
            return unary[node.func](args[0])
        if node.func is sympy.Heaviside:
            return jnp.where(args[0] > 0, 1.0, jnp.where(args[0] < 0, 0.0, 0.5))
        if node.func in (sympy.Max, sympy.Min):
            combine = jnp.maximum if node.func is sympy.Max else jnp.minimum
            result = args[0]
            for a in args[1:]:
                result = combine(result, a)
            return result
        raise ValueError(f"cannot compile {node.func.__name__} in {expression}")

    return walk(expression)


def compile_expression(text: str, variables: Sequence[str]) -> Callable[..., jax.Array]:
    """``text`` as a function of arrays ``(*variables) -> array`` built from ``jax.numpy``
    (jit-, vmap- and grad-able), broadcasting its arguments; see :func:`parse_expression`."""
    expression = parse_expression(text, variables)
    variables = tuple(variables)

    def evaluate(*values):
        if len(values) != len(variables):
            raise TypeError(f"expected {len(variables)} arrays ({', '.join(variables)}), "
                            f"got {len(values)}")
        arrays = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in values))
        result = _jax_of(expression, dict(zip(variables, arrays, strict=True)))
        return jnp.broadcast_to(jnp.asarray(result, jnp.float32), arrays[0].shape)

    return evaluate


def symbolic_value_term(value: str) -> LossTerm:
    """Value loss ``mean(d(values - targets))`` with ``d`` the expression ``value`` in ``x``."""
    distance = compile_expression(value, VALUE_VARIABLES)

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        del meta_params
        return jnp.mean(distance(inputs.values - inputs.targets))

    return LossTerm("symbolic", no_meta_params, loss)


def symbolic_drift_term(drift: str) -> LossTerm:
    """Policy loss ``-mean(r A - D(r, A, p))`` with ``D`` the expression ``drift``."""
    penalty = compile_expression(drift, DRIFT_VARIABLES)

    def loss(meta_params: dict, inputs: LossInputs) -> jax.Array:
        del meta_params
        progress = jnp.zeros(()) if inputs.progress is None else inputs.progress
        drift_values = penalty(inputs.ratio, inputs.advantages, progress)
        return -jnp.mean(inputs.ratio * inputs.advantages - drift_values)

    return LossTerm("symbolic_drift", no_meta_params, loss)


@register_objective("symbolic", slots=("value",), baselines=("ppo", "l2", "huber"),
                    tunables=(VF_COEF, LEARNING_RATE))
def make_symbolic(value: str = "0.5*x**2") -> Objective:
    """A value distance written as an expression in ``x = value - target``."""
    return Objective(value=symbolic_value_term(value))


@register_objective("symbolic_drift", slots=("policy",), algorithms=("ppo", "recurrent_ppo"),
                    baselines=("ppo", "dpo"), tunables=(LEARNING_RATE,))
def make_symbolic_drift(drift: str = "0") -> Objective:
    """A drift written as an expression in ``r``, ``A`` and ``p`` as PPO's policy loss."""
    return Objective(policy=symbolic_drift_term(drift))
