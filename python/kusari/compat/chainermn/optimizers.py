"""chainermn.optimizers: create_multi_node_optimizer."""

from kusari.mn import create_multi_node_optimizer  # noqa: F401
