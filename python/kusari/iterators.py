"""Iterators (Chainer's chainer.iterators): kusari's C++ iterators over any dataset.

MultiprocessIterator is the multithreaded one (threads, not processes: kusari decodes in C++
threads, and forking after MPI starts is unsafe); n_processes gives its number of threads.
"""

from kusari._kusari.data import ImageLoader, Iterator, MultithreadIterator, SerialIterator  # noqa: F401


def MultiprocessIterator(dataset, batch_size, repeat=True, shuffle=True, n_processes=None, n_prefetch=1,
                         shared_mem=None, seed=None, **kwargs):
    """Chainer's MultiprocessIterator, served by kusari's MultithreadIterator."""
    return MultithreadIterator(dataset, batch_size, repeat=repeat, shuffle=shuffle, n_threads=n_processes,
                               seed=seed)
