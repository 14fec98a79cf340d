"""Shared helpers of kusari's Python tests."""

import numpy as np
import pytest

import kusari


def numerical_grad(f, x, eps=1e-3):
    """d sum(f(x) * w) / dx by central differences, for a float64 NumPy x (w fixed by the caller)."""
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gflat = g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        plus = f(x)
        flat[i] = old - eps
        minus = f(x)
        flat[i] = old
        gflat[i] = (plus - minus) / (2 * eps)
    return g


def check_backward(fn, inputs, atol=1e-4, rtol=1e-3, seed=0):
    """Compares kusari's gradients of sum(fn(*inputs) * w) with numerical ones (float64 inputs)."""
    rng = np.random.RandomState(seed)
    xs = [np.asarray(x, dtype=np.float64) for x in inputs]
    out = fn(*[kusari.Variable(x.copy()) for x in xs])
    w = rng.uniform(-1, 1, out.shape)

    def scalar(*arrays):
        with kusari.no_backprop_mode():
            return float(np.sum(np.asarray(fn(*[kusari.Variable(a) for a in arrays]).array) * w))

    vs = [kusari.Variable(x.copy()) for x in xs]
    y = fn(*vs)
    loss = kusari.functions.sum(y * w)
    loss.backward()
    for k, x in enumerate(xs):
        def f(xk, k=k):
            args = [a.copy() for a in xs]
            args[k] = xk
            return scalar(*args)
        expected = numerical_grad(f, x.copy())
        np.testing.assert_allclose(vs[k].grad, expected, atol=atol, rtol=rtol,
                                   err_msg='gradient of input {}'.format(k))


@pytest.fixture
def rng():
    return np.random.RandomState(0)
