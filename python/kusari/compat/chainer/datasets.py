"""chainer.datasets over kusari.datasets. get_mnist reads the local IDX files
($KUSARI_DATASET_ROOT/mnist, or a directory): nothing is downloaded."""

from kusari.datasets import *  # noqa: F401,F403
from kusari.datasets import DatasetMixin, SubDataset, TupleDataset, get_fashion_mnist, get_mnist  # noqa: F401
