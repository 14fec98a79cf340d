"""chainer.optimizer_hooks over kusari.optimizer_hooks."""

from kusari.optimizer_hooks import *  # noqa: F401,F403
