"""Chainer's top-level names, over kusari (kusari.compat: see docs/python.md)."""

import kusari
from kusari import (Chain, ChainList, FunctionNode, Link, Parameter, Sequential, Variable, as_array,  # noqa: F401
                    as_variable, config, force_backprop_mode, grad, no_backprop_mode, using_config)
from kusari.training import report  # noqa: F401
from kusari.compat.chainer import backends, cuda  # noqa: F401
from kusari.compat.chainer import dataset, datasets, functions, initializers, iterators, links  # noqa: F401
from kusari.compat.chainer import optimizer_hooks, optimizers, reporter, serializers, training  # noqa: F401
from kusari.compat.chainer.backends import get_device  # noqa: F401

__version__ = '7.8.1+kusari.' + kusari.__version__
Optimizer = kusari.optimizers.Optimizer
get_array_module = cuda.get_array_module


def print_runtime_info(out=None):
    """Prints the versions of what runs the program."""
    import sys
    info = kusari.build_info()
    (out or sys.stdout).write('kusari {} (compatible with Chainer {}); CUDA {}, MPI {}\n'.format(
        info['version'], __version__, info['cuda'], info['mpi']))


def is_debug():
    return False


def set_debug(debug):
    pass


class DictSummary(dict):
    """Not provided: summaries are kept by kusari's LogReport."""
