"""chainer.iterators over kusari.iterators."""

from kusari.iterators import *  # noqa: F401,F403
