"""Parameter initializers (Chainer's chainer.initializers)."""

from kusari._kusari.links.initializers import (Constant, GlorotNormal, GlorotUniform, HeNormal, HeUniform,  # noqa
                                               Initializer, LeCunNormal, LeCunUniform, Normal, One, Uniform,
                                               Zero)
