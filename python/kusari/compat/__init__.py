"""Chainer and ChainerMN programs on kusari.

    python3 -m kusari.compat train_mnist.py --epoch 5        # an unmodified Chainer/ChainerMN script
    from kusari.compat import chainer, chainermn             # or import the modules by name

While a script runs under ``python3 -m kusari.compat``, the module names ``chainer``,
``chainer.*`` and ``chainermn`` (with its submodules) resolve to kusari's compatibility modules
(kusari.compat.chainer, kusari.compat.chainermn): Chainer's names over kusari's C++ objects.
What differs from Chainer, and what is not supported, is in docs/python.md.
"""

import importlib
import importlib.abc
import importlib.util
import sys

_ROOTS = ('chainer', 'chainermn')


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves chainer.* and chainermn.* to kusari.compat.chainer.* and kusari.compat.chainermn.*."""

    def find_spec(self, fullname, path, target=None):
        if fullname.split('.')[0] not in _ROOTS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        name = 'kusari.compat.' + spec.name
        try:
            module = importlib.import_module(name)
            if not hasattr(module, '__path__'):
                # (So that `import chainer.links.model` reaches this finder and its message, instead
                # of Python's "'chainer.links' is not a package".)
                module.__path__ = []
            return module
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            raise ModuleNotFoundError(
                'kusari.compat: {} is not supported (kusari.compat provides {}; see docs/python.md, '
                '"What is not supported")'.format(spec.name, ', '.join(_ROOTS)), name=spec.name) from None

    def exec_module(self, module):
        pass


_finder = _Finder()


def install():
    """From now on, ``import chainer`` and ``import chainermn`` give kusari's compatibility modules."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for root in _ROOTS:
        sys.modules.pop(root, None)


def __getattr__(name):
    if name in _ROOTS:
        return importlib.import_module('kusari.compat.' + name)
    raise AttributeError('module kusari.compat has no attribute {!r}'.format(name))
