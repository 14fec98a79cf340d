"""Differentiable functions (Chainer's chainer.functions): kusari's C++ functions.

Every argument that is a variable takes a Variable or any array (NumPy, kusari, CuPy and PyTorch
tensors through DLPack), wrapped without a copy on the CPU.
"""

from kusari._kusari.functions import *  # noqa: F401,F403
from kusari._kusari.functions import (absolute, add, concat, div, dropout, mul, relu, reshape,  # noqa: F401
                                      softmax_cross_entropy, sub, sum, transpose)
from kusari._kusari import functions as _f


def identity(*inputs):
    """Returns the inputs (Chainer's F.identity)."""
    return inputs[0] if len(inputs) == 1 else inputs


def hstack(xs):
    """Concatenates along axis 1 (axis 0 for 1-d inputs)."""
    return _f.concat(xs, axis=0 if xs[0].ndim == 1 else 1)


def vstack(xs):
    """Concatenates along axis 0."""
    return _f.concat(xs, axis=0)


def mean_absolute_error(x0, x1):
    """The mean of |x0 - x1|."""
    return _f.mean(_f.abs(_f.sub(x0, x1)))


def negative(x):
    return _f.neg(x)
