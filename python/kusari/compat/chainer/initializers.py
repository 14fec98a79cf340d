"""chainer.initializers over kusari.initializers."""

from kusari.initializers import *  # noqa: F401,F403
