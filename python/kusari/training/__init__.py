"""The training loop (Chainer's chainer.training): kusari's C++ Trainer, updaters, triggers and
extensions. Extensions and triggers may be written in Python (Note [Extensions written in Python]
in python/src/training.cc)."""

from kusari._kusari.training import (PRIORITY_EDITOR, PRIORITY_READER, PRIORITY_WRITER,  # noqa: F401
                                     StandardUpdater, Trainer, Trigger, Updater, report)
from kusari.training import extensions, triggers, updaters  # noqa: F401
from kusari.training.extensions import Extension, make_extension  # noqa: F401
from kusari.training.triggers import get_trigger  # noqa: F401
