"""Thread-local switches: backprop recording and train/test mode (Chainer's chainer.config)."""

import contextlib
import threading

from kusari import _kusari


def no_backprop_mode():
    """``with kusari.no_backprop_mode():`` functions record no graph (Chainer's no_backprop_mode)."""
    return _kusari._NoBackpropMode()


def force_backprop_mode():
    """``with kusari.force_backprop_mode():`` functions record the graph even inside no_backprop_mode."""
    return _kusari._ForceBackpropMode()


@contextlib.contextmanager
def using_config(name, value):
    """``with kusari.using_config('train', False):`` test mode (also 'enable_backprop')."""
    if name == 'train':
        with _kusari._TrainMode(bool(value)):
            yield
    elif name == 'enable_backprop':
        with (_kusari._ForceBackpropMode() if value else _kusari._NoBackpropMode()):
            yield
    else:
        # Other settings are remembered for code that reads them (chainer.config.<name>).
        old = getattr(config, name, None)
        setattr(config, name, value)
        try:
            yield
        finally:
            setattr(config, name, old)


class _Config(threading.local):
    """``kusari.config.train`` and ``kusari.config.enable_backprop`` read kusari's switches; setting
    them switches this thread until set again."""

    def __init__(self):
        super().__init__()
        self._scopes = {}

    @property
    def train(self):
        return _kusari.is_train_mode()

    @train.setter
    def train(self, value):
        self._switch('train', _kusari._TrainMode(bool(value)))

    @property
    def enable_backprop(self):
        return _kusari.is_backprop_enabled()

    @enable_backprop.setter
    def enable_backprop(self, value):
        self._switch('enable_backprop', _kusari._ForceBackpropMode() if value else _kusari._NoBackpropMode())

    def _switch(self, name, scope):
        old = self._scopes.pop(name, None)
        if old is not None:
            old.__exit__(None, None, None)
        scope.__enter__()
        self._scopes[name] = scope

    def show(self):
        """Prints the switches."""
        print('enable_backprop', self.enable_backprop)
        print('train', self.train)


config = _Config()
