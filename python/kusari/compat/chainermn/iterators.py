"""chainermn.iterators: synchronized and multi-node iterators."""

from kusari.mn import create_multi_node_iterator, create_synchronized_iterator  # noqa: F401
