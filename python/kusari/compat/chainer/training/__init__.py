"""chainer.training over kusari.training."""

from kusari.training import (PRIORITY_EDITOR, PRIORITY_READER, PRIORITY_WRITER, Extension,  # noqa: F401
                             StandardUpdater, Trainer, Updater, get_trigger, make_extension)
from kusari.compat.chainer.training import extensions, triggers, updaters  # noqa: F401
