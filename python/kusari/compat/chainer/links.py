"""chainer.links over kusari.links."""

from kusari.links import *  # noqa: F401,F403
from kusari.links import Chain, ChainList, Link, Sequential  # noqa: F401,E402
