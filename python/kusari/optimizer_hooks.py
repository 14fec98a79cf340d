"""Optimizer hooks (Chainer's chainer.optimizer_hooks). A hook may also be any callable taking the
optimizer, with optional ``name`` and ``timing`` ('pre' or 'post') attributes."""

from kusari._kusari.optimizers.hooks import (GradientClipping, GradientHardClipping, Lasso,  # noqa: F401
                                             WeightDecay, gradient_norm)
