"""chainer.backends.cuda (also chainer.cuda): GPU selection and array moves, over kusari's devices.

There is no CuPy here: kusari's GPU arrays are kusari.ndarray (CuPy and PyTorch take them through
DLPack). get_array_module(x) is numpy for CPU arrays and kusari for GPU ones.
"""

import numpy

import kusari

available = kusari.cuda_available()
cudnn_enabled = available
cupy = None
_current = [0]


class _DeviceWithUse(object):
    """A device with Chainer's use() (which makes it the GPU of to_gpu() without an argument)."""

    def __init__(self, device):
        self.kusari_device = device

    @property
    def id(self):
        return self.kusari_device.index if self.kusari_device.is_cuda else -1

    def use(self):
        if self.kusari_device.is_cuda:
            _current[0] = self.kusari_device.index
        return self

    def __enter__(self):
        self._previous = _current[0]
        return self.use()

    def __exit__(self, *args):
        _current[0] = self._previous

    def synchronize(self):
        self.kusari_device.synchronize()

    def __repr__(self):
        return '<device {}>'.format(self.kusari_device)


def get_device_from_id(device_id):
    """The GPU numbered device_id (-1 or None: the CPU)."""
    if device_id is None or device_id < 0:
        return _DeviceWithUse(kusari.Device('cpu'))
    return _DeviceWithUse(kusari.Device('cuda:{}'.format(device_id)))


def get_device_from_array(array):
    return _DeviceWithUse(getattr(array, 'device', kusari.Device('cpu')))


def current_device():
    return kusari.Device('cuda:{}'.format(_current[0]))


def check_cuda_available():
    if not kusari.cuda_available():
        raise RuntimeError('CUDA environment is not correctly set up: kusari sees no GPU')


def get_array_module(*args):
    for a in args:
        a = a.array if isinstance(a, kusari.Variable) else a
        if isinstance(a, kusari.ndarray) and not a.device.is_cpu:
            return kusari
    return numpy


def to_cpu(array, stream=None):
    """A NumPy array of `array` (a copy only when it is not on the CPU already)."""
    if array is None:
        return None
    if isinstance(array, kusari.Variable):
        array = array.array
    if isinstance(array, kusari.ndarray):
        return array.get()
    return numpy.asarray(array)


def to_gpu(array, device=None, stream=None):
    """`array` on the GPU (the current one unless `device` says)."""
    if array is None:
        return None
    dev = kusari.Device('cuda:{}'.format(_current[0] if device is None else
                                           getattr(device, 'id', device)))
    return kusari.asarray(array, device=dev)


def _link_to_gpu(self, device=None):
    """Moves the link to the GPU (the current one, chosen by get_device_from_id(i).use(), unless given)."""
    index = _current[0] if device is None else getattr(device, 'id', device)
    return self.to_device(kusari.Device('cuda:{}'.format(index)))


kusari.Link.to_gpu = _link_to_gpu
