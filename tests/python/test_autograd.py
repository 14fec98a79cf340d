"""Variables, backward, grad, modes, operators and functions written in Python."""

import numpy as np
import pytest

import kusari
import kusari.functions as F
from conftest import check_backward


def test_backward_and_grads(rng):
    x = kusari.Variable(rng.randn(3, 4).astype(np.float32))
    w = kusari.Variable(rng.randn(4, 2).astype(np.float32))
    y = F.sum(F.tanh(F.matmul(x, w)))
    y.backward()
    assert x.grad.shape == (3, 4) and w.grad.shape == (4, 2)
    x.cleargrad()
    assert x.grad is None


def test_operators_with_numpy_and_scalars(rng):
    a = rng.randn(3).astype(np.float32)
    x = kusari.Variable(a)
    for got, want in ((x + 1, a + 1), (2 * x, 2 * a), (x - a, a * 0), (a - x, a * 0), (x / 2, a / 2),
                      (1 / (x * x + 1), 1 / (a * a + 1)), (x ** 2, a ** 2), (2 ** x, 2 ** a), (-x, -a),
                      (abs(x), abs(a)), (a + x, 2 * a)):
        assert isinstance(got, kusari.Variable)
        np.testing.assert_allclose(got.array, want, rtol=1e-6)
    np.testing.assert_allclose(x[1:].array, a[1:])
    np.testing.assert_allclose(x[None, ::-1].array, a[None, ::-1])
    assert x.reshape(3, 1).shape == (3, 1) and x.reshape((1, 3)).T.shape == (3, 1)


def test_grad_function_and_double_backprop():
    x = kusari.Variable(np.array([1.5, -0.5]))
    y = x * x * x
    gx, = kusari.grad([y], [x], grad_outputs=[np.ones(2)], enable_double_backprop=True)
    np.testing.assert_allclose(gx.array, 3 * np.array([1.5, -0.5]) ** 2)
    F.sum(gx).backward()
    np.testing.assert_allclose(x.grad, 6 * np.array([1.5, -0.5]))


def test_no_backprop_mode_and_config():
    x = kusari.Variable(np.ones(2, np.float32))
    with kusari.no_backprop_mode():
        assert not kusari.config.enable_backprop
        y = x * 2
    assert y.creator is None and kusari.config.enable_backprop
    assert kusari.config.train
    with kusari.using_config('train', False):
        assert not kusari.config.train
        np.testing.assert_array_equal(F.dropout(x, 0.9).array, x.array)
    assert kusari.config.train


class Cube(kusari.FunctionNode):
    """y = x^3, gy * 3x^2: written in Python, differentiable twice."""

    def forward(self, inputs):
        x, = inputs
        return x ** 3,

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        gy, = grad_outputs
        return 3 * x * x * gy,


class Split2(kusari.FunctionNode):
    """Two outputs (x + y, x * y), with an output retained."""

    def forward(self, inputs):
        x, y = inputs
        self.retain_outputs((1,))
        return x + y, x * y

    def backward(self, indexes, grad_outputs):
        x, y = self.get_retained_inputs()
        prod, = self.get_retained_outputs()
        ga, gb = grad_outputs
        gx = (ga if ga is not None else 0) + (gb * y if gb is not None else 0)
        gy = (ga if ga is not None else 0) + (gb * x if gb is not None else 0)
        return gx, gy


def test_python_function_gradients(rng):
    check_backward(lambda x: Cube().apply((x,))[0], [rng.randn(3, 2)])
    check_backward(lambda x, y: F.sum(Split2().apply((x, y))[0] * 2 + Split2().apply((x, y))[1]),
                   [rng.randn(4), rng.randn(4)])


def test_python_function_double_backprop():
    x = kusari.Variable(np.array([2.0]))
    y, = Cube().apply((x,))
    gx, = kusari.grad([y], [x], enable_double_backprop=True)
    np.testing.assert_allclose(gx.array, [12.0])
    gx.backward()
    np.testing.assert_allclose(x.grad, [12.0])  # d(3x^2)/dx = 6x


def test_python_function_errors():
    class NoTuple(kusari.FunctionNode):
        def forward(self, inputs):
            return inputs[0]
    with pytest.raises(TypeError, match='NoTuple.forward must return a tuple'):
        NoTuple().apply((np.ones(2),))

    class BadBackward(kusari.FunctionNode):
        def forward(self, inputs):
            return inputs[0] * 2,

        def backward(self, indexes, grad_outputs):
            return 1, 2, 3
    y, = BadBackward().apply((kusari.Variable(np.ones(2)),))
    with pytest.raises(ValueError, match='BadBackward.backward returned 3 gradients'):
        F.sum(y).backward()
