"""chainer.dataset.convert: concat_examples (kusari's, in C++)."""

from kusari.datasets import concat_examples  # noqa: F401
