"""kusari: define-by-run deep learning with a C++ core, and multi-node training over MPI and NCCL.

The Python package is a front end over kusari's C++ objects (Note [The Python front end] in
python/src/module.cc): Chainer's names and conventions, kusari's kernels and training loop.

    import kusari
    import kusari.functions as F
    import kusari.links as L

    class MLP(kusari.Chain):
        def __init__(self, n_units, n_out):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(None, n_units)
                self.l2 = L.Linear(None, n_out)

        def forward(self, x):
            return self.l2(F.relu(self.l1(x)))

See docs/python.md.
"""

import sys as _sys

import numpy as _numpy

try:  # pybind11 looks NumPy's C API up in numpy.core.multiarray, which NumPy 2 made private.
    import numpy.core.multiarray  # noqa: F401
except ImportError:  # pragma: no cover (NumPy without the old name)
    _sys.modules['numpy.core.multiarray'] = _numpy._core.multiarray

from kusari import _kusari  # noqa: E402
from kusari._kusari import (  # noqa: E402  # noqa: F401
    CommunicatorError, Device, KusariError, Parameter, Variable, __version__, asarray, build_info,
    cuda_available, cuda_device_count, from_dlpack, get_blas_num_threads, get_num_threads, grad,
    is_backprop_enabled, is_train_mode, manual_seed, ndarray, only_check_arguments, set_blas_num_threads,
    set_num_threads)
from kusari._link import Chain, ChainList, Link, Sequential  # noqa: F401,E402
from kusari._config import config, force_backprop_mode, no_backprop_mode, using_config  # noqa: F401,E402
from kusari._function import FunctionNode  # noqa: F401,E402
from kusari import functions, links, initializers, optimizers, optimizer_hooks  # noqa: F401,E402
from kusari import datasets, iterators, training, serializers, models, mn  # noqa: F401,E402
from kusari.training import report  # noqa: F401,E402

cpu = Device('cpu')


def get_device(spec):
    """A kusari.Device from 'cpu', 'cuda:N', '@cupy:N', '@numpy', an int (-1: the CPU) or a Device."""
    return Device(spec)


def as_variable(x):
    """x itself when it is a Variable, else a Variable of it that requires no gradient."""
    if isinstance(x, Variable):
        return x
    return Variable(x, requires_grad=False)


def as_array(x):
    """The array of a Variable, or x itself."""
    return x.array if isinstance(x, Variable) else x
