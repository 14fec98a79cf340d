"""chainer.training.updaters over kusari.training.updaters."""

from kusari.training.updaters import StandardUpdater, Updater  # noqa: F401
