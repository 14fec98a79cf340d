"""chainer.backends: cuda, and get_device."""

import kusari
from kusari.compat.chainer.backends import cuda  # noqa: F401


def get_device(device_spec):
    """A device from Chainer's specifiers: '@numpy', '@cupy:N', -1, N, or a kusari device."""
    return cuda._DeviceWithUse(kusari.Device(device_spec))
