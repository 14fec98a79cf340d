"""chainer.serializers over kusari.serializers."""

from kusari.serializers import *  # noqa: F401,F403
