"""Trainer extensions (Chainer's chainer.training.extensions): kusari's C++ extensions; extensions
written in Python (subclasses of Extension, make_extension, or any callable taking the trainer);
and DumpGraph."""

import os

from kusari._kusari.training import PRIORITY_READER, PRIORITY_WRITER  # noqa: F401
from kusari._kusari.training.extensions import (Evaluator, ExponentialShift, FailOnNonNumber,  # noqa: F401
                                                LinearShift, LogReport, PlotReport, PrintReport, ProgressBar,
                                                observe_lr, observe_value, snapshot, snapshot_object)


class Extension(object):
    """An extension written in Python: define __call__(self, trainer). Optional attributes:
    trigger ((1, 'iteration') when absent), priority, name/default_name; optional methods
    initialize(trainer), finalize(), on_error(trainer, exc, tb) and serialize(serializer)."""

    trigger = (1, 'iteration')
    priority = PRIORITY_READER
    name = None

    @property
    def default_name(self):
        return type(self).__name__

    def __call__(self, trainer):
        raise NotImplementedError('{}: define __call__(self, trainer)'.format(type(self).__name__))


def make_extension(trigger=None, default_name=None, priority=None, finalizer=None, initializer=None,
                   on_error=None, **kwargs):
    """Decorator making a function an extension (Chainer's make_extension)."""

    def decorator(ext):
        ext.trigger = trigger if trigger is not None else (1, 'iteration')
        ext.default_name = default_name or getattr(ext, '__name__', type(ext).__name__)
        ext.priority = priority if priority is not None else PRIORITY_READER
        if finalizer is not None:
            ext.finalize = finalizer
        if initializer is not None:
            ext.initialize = initializer
        if on_error is not None:
            ext.on_error = on_error
        return ext

    return decorator


class DumpGraph(Extension):
    """Writes the computational graph of the loss to `filename` in the trainer's out folder, in
    Graphviz's dot language (Chainer's DumpGraph). kusari frees a training step's graph during its
    backward pass, so the graph is recorded once, when training starts, from a forward pass of the
    optimizer's target over the first batch of the main iterator's dataset (the iterator itself is
    not advanced, and no backward runs). `root_name` names the reported loss ('main/loss')."""

    trigger = (1, 'iteration')
    priority = PRIORITY_READER

    def __init__(self, root_name, filename='cg.dot', variable_style=None, function_style=None):
        self._root_name = root_name
        self._filename = filename

    def initialize(self, trainer):
        import kusari
        from kusari.datasets import concat_examples
        updater = trainer.updater
        target = updater.get_optimizer('main').target
        iterator = updater.get_iterator('main')
        dataset = getattr(iterator, 'dataset', None)
        if dataset is None or len(dataset) == 0:
            return
        batch = [dataset[i] for i in range(min(iterator.batch_size, len(dataset)))]
        arrays = concat_examples(batch, getattr(updater, 'device', None))
        if not isinstance(arrays, tuple):
            arrays = (arrays,)
        with kusari.using_config('train', True), kusari.force_backprop_mode():
            root = target(*arrays)
        self._write(trainer, root)

    def __call__(self, trainer):
        pass

    def _write(self, trainer, root):
        lines = ['digraph graphname{rankdir=TB;']
        ids = {}

        def node_id(obj):
            key = (type(obj).__name__, hash(obj))
            if key not in ids:
                ids[key] = len(ids)
            return 'n{}'.format(ids[key])

        stack = [root]
        visited = set()
        while stack:
            v = stack.pop()
            if hash(v) in visited:
                continue
            visited.add(hash(v))
            label = self._root_name if v is root else (v.name or 'variable')
            lines.append('{} [label="{}: {} {}", shape="oval"];'.format(node_id(v), label, tuple(v.shape), v.dtype))
            creator = v.creator
            if creator is None:
                continue
            fid = node_id(creator)
            lines.append('{} [label="{}", shape="box", style="filled", fillcolor="gray"];'.format(fid, creator.name))
            lines.append('{} -> {};'.format(fid, node_id(v)))
            for x in creator.inputs:
                lines.append('{} -> {};'.format(node_id(x), fid))
                stack.append(x)
        lines.append('}')
        os.makedirs(trainer.out, exist_ok=True)
        path = os.path.join(trainer.out, self._filename)
        tmp = path + '.tmp'
        with open(tmp, 'w') as f:
            f.write('\n'.join(lines) + '\n')
        os.replace(tmp, path)
