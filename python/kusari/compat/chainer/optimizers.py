"""chainer.optimizers over kusari.optimizers."""

from kusari.optimizers import *  # noqa: F401,F403
