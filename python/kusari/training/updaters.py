"""Updaters (Chainer's chainer.training.updaters).

StandardUpdater(iterator, optimizer, converter=None, device=None, loss_func=None): the iterator and
the optimizer may be dicts ({'gen': opt_gen, 'dis': opt_dis}); a subclass may override update_core
and use get_iterator(name), get_optimizer(name), converter(batch, device) and device.
"""

from kusari._kusari.training import StandardUpdater, Updater  # noqa: F401
