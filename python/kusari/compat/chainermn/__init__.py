"""ChainerMN's names, over kusari.mn (kusari.compat: see docs/python.md)."""

from kusari.mn import (CommunicatorError, create_communicator, create_multi_node_evaluator,  # noqa: F401
                       create_multi_node_optimizer, create_empty_dataset, scatter_dataset, scatter_index)
from kusari.compat.chainermn import datasets, extensions, functions, iterators, links, optimizers  # noqa: F401

__version__ = '1.3.0+kusari'
