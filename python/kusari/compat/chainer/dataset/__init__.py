"""chainer.dataset: concat_examples, DatasetMixin, Iterator."""

from kusari.datasets import DatasetMixin, concat_examples  # noqa: F401
from kusari.iterators import Iterator  # noqa: F401
from kusari.compat.chainer.dataset import convert  # noqa: F401
