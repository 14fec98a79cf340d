"""Links (Chainer's chainer.links): kusari's C++ links, and Link, Chain, ChainList, Sequential.

Chainer's argument conventions hold: ``L.Linear(out_size)`` and ``L.Linear(None, out_size)``
infer the input size at the first call; ``L.Convolution2D(out_channels, ksize)`` likewise.
"""

from kusari._kusari.links import (BatchNormalization, Classifier, Convolution2D, Deconvolution2D,  # noqa: F401
                                  EmbedID, KVCache, LayerNormalization, LSTM, Linear, MultiHeadAttention,
                                  RMSNormalization, TransformerBlock)
from kusari._link import Chain, ChainList, Link, Sequential  # noqa: F401
from kusari._kusari.mn import MultiNodeBatchNormalization  # noqa: F401
