"""Multi-node training (ChainerMN's chainermn), over kusari's C++ communicators.

    import kusari.mn
    comm = kusari.mn.create_communicator('naive')       # 'pure_nccl' on GPUs
    optimizer = kusari.mn.create_multi_node_optimizer(kusari.optimizers.Adam(), comm)
    train = kusari.mn.scatter_dataset(train, comm, shuffle=True)

Run with ``mpiexec -n N python3 script.py``. An exception on one rank ends the whole job with one
report (Note [A Python rank that fails] in python/src/mn.cc).
"""

import functools
import operator

from kusari._kusari.mn import (AllreducePersistent, Communicator, CommunicatorError,  # noqa: F401
                               DistributedIterator, Join, MultiNodeBatchNormalization, MultiNodeCheckpointer, MultiNodeEarlyStoppingTrigger,
                               ObservationAggregator, communicator_names, create_communicator, create_mnbn_model,
                               create_multi_node_checkpointer, create_multi_node_evaluator,
                               create_multi_node_iterator, create_multi_node_optimizer, create_synchronized_iterator,
                               load_newest_snapshot_set, load_snapshot_files, load_snapshot_of_each_rank,
                               merge_snapshot_files, multi_node_snapshot, names_snapshot_folder,
                               newest_complete_snapshot_set, scatter_dataset, scatter_index, shard_stats,
                               summon_full_parameters)
from kusari.mn import functions  # noqa: F401


def _allreduce_obj(self, obj, op=None):
    """The sum (or op(a, b) reduction) of every rank's picklable object, on every rank."""
    values = self.allgather_obj(obj)
    return functools.reduce(op or operator.add, values)


Communicator.allreduce_obj = _allreduce_obj


def create_empty_dataset(dataset):
    """A dataset of as many empty examples as `dataset` (ChainerMN's create_empty_dataset)."""
    return [()] * len(dataset)
