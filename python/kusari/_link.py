"""Link, Chain, ChainList and Sequential: the C++ classes, with what Python code writes by habit.

The classes are kusari's C++ links (Note [Links written in Python] in python/src/links.cc); this
module adds Chainer's Python conventions to them:

- ``with self.init_scope(): self.l1 = L.Linear(100)`` registers the child link (or a
  ``kusari.Parameter``) under the attribute's name; ``Chain(l1=..., l2=...)`` does the same;
- ``link(x, ...)`` calls ``link.forward(x, ...)``; a subclass defines ``forward`` (or, as older
  Chainer code does, ``__call__``).
"""

import contextlib

from kusari import _kusari

_L = _kusari.links
Link = _L.Link
Chain = _L.Chain
ChainList = _L.ChainList
Sequential = _L.Sequential


def _call(self, *args, **kwargs):
    """Calls ``forward`` with the arguments (Chainer's ``Link.__call__``)."""
    return self.forward(*args, **kwargs)


@contextlib.contextmanager
def _init_scope(self):
    """Within it, assigning a link or a parameter to an attribute registers it."""
    old = self.__dict__.get('_within_init_scope', False)
    object.__setattr__(self, '_within_init_scope', True)
    try:
        yield
    finally:
        object.__setattr__(self, '_within_init_scope', old)


def _register(self, name, value):
    if isinstance(value, _kusari.Parameter):
        self._register_param(name, value)
    elif isinstance(value, Link):
        if isinstance(self, ChainList):
            raise TypeError('{}: a ChainList registers links with append(), not as attribute {!r}'.format(
                type(self).__name__, name))
        self._add_link(name, value)


def _setattr(self, name, value):
    if self.__dict__.get('_within_init_scope', False) and isinstance(value, (Link, _kusari.Parameter)):
        _register(self, name, value)
    object.__setattr__(self, name, value)


def _add_persistent(self, name, value):
    """Registers a persistent value (saved, moved with the link, not trained); readable as an attribute."""
    self._add_persistent_cpp(name, value)
    object.__setattr__(self, name, self.persistent(name))


def _links(self, skipself=False):
    for _, link in self.namedlinks(skipself):
        yield link


def _init_chain(self, **links):
    _chain_init(self)
    with self.init_scope():
        for name in sorted(links):
            setattr(self, name, links[name])


def _init_chainlist(self, *links):
    _chainlist_init(self)
    for link in links:
        self.append(link)


def _chainlist_iter(self):
    return (self[i] for i in range(len(self)))


def _init_sequential(self, *layers):
    _sequential_init(self)
    for layer in layers:
        self.append(layer)


def _sequential_append(self, layer):
    """Appends a link (its parameters become the sequence's) or a function such as F.relu."""
    if isinstance(layer, Link):
        self._add_link(layer)
        self.__dict__.setdefault('_kusari_layers', []).append(layer)
    elif callable(layer):
        self._add_function(layer)
        self.__dict__.setdefault('_kusari_layers', []).append(layer)
    else:
        raise TypeError('Sequential: a layer is a link or a function, got {}'.format(type(layer).__name__))


_chain_init = Chain.__init__
_chainlist_init = ChainList.__init__
_sequential_init = Sequential.__init__

Link.__call__ = _call
Link.init_scope = _init_scope
Link.__setattr__ = _setattr
Link._add_persistent_cpp = Link.add_persistent
Link.add_persistent = _add_persistent
Link.links = _links
Link.within_init_scope = property(lambda self: self.__dict__.get('_within_init_scope', False))
Link.register_persistent = lambda self, name: self.add_persistent(name, getattr(self, name))
Chain.__init__ = _init_chain
ChainList.__init__ = _init_chainlist
ChainList.__iter__ = _chainlist_iter
Sequential.__init__ = _init_sequential
Sequential.append = _sequential_append
Link._set_base_call(_call)

__all__ = ['Link', 'Chain', 'ChainList', 'Sequential']
