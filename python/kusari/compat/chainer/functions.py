"""chainer.functions over kusari.functions."""

from kusari.functions import *  # noqa: F401,F403
from kusari.functions import identity, hstack, vstack, mean_absolute_error, negative  # noqa: F401,E402
