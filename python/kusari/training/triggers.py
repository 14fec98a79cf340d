"""Triggers (Chainer's chainer.training.triggers). A trigger may also be (period, 'epoch' |
'iteration') or any callable taking the trainer and returning a bool."""

from kusari._kusari.training import Trigger  # noqa: F401
from kusari._kusari.training.triggers import (EarlyStoppingTrigger, IntervalTrigger,  # noqa: F401
                                              ManualScheduleTrigger)


def get_trigger(trigger):
    """A trigger of Chainer's forms: None (never... as Chainer: fires every iteration), a tuple, a
    trigger object or a callable."""
    if trigger is None:
        return IntervalTrigger(1, 'iteration')
    if isinstance(trigger, tuple):
        return IntervalTrigger(*trigger)
    return trigger


class _ValueTrigger(object):
    """Fires at the check trigger when the monitored value is the best seen so far."""

    def __init__(self, key, better, trigger=(1, 'epoch')):
        self._key = key
        self._better = better
        self._best = None
        self._interval = get_trigger(trigger)
        self._summary = []

    def __call__(self, trainer):
        obs = trainer.observation
        if self._key in obs:
            self._summary.append(float(obs[self._key]))
        if not self._interval(trainer):
            return False
        if not self._summary:
            return False
        value = sum(self._summary) / len(self._summary)
        self._summary = []
        if self._best is None or self._better(value, self._best):
            self._best = value
            return True
        return False


def MaxValueTrigger(key, trigger=(1, 'epoch')):
    """Fires when the mean of `key` over the interval is the largest so far (Chainer's MaxValueTrigger)."""
    return _ValueTrigger(key, lambda a, b: a > b, trigger)


def MinValueTrigger(key, trigger=(1, 'epoch')):
    """Fires when the mean of `key` over the interval is the smallest so far (Chainer's MinValueTrigger)."""
    return _ValueTrigger(key, lambda a, b: a < b, trigger)
