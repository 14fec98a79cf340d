"""chainermn.extensions: the multi-node checkpointer, snapshots and observation aggregation."""

from kusari.mn import (AllreducePersistent, MultiNodeEarlyStoppingTrigger, ObservationAggregator,  # noqa: F401
                       create_multi_node_checkpointer, multi_node_snapshot)
