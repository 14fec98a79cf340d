"""chainer.cuda (Chainer's older name of chainer.backends.cuda)."""

from kusari.compat.chainer.backends.cuda import *  # noqa: F401,F403
from kusari.compat.chainer.backends.cuda import (_DeviceWithUse, available, check_cuda_available,  # noqa: F401
                                                 cupy, current_device, get_array_module,
                                                 get_device_from_array, get_device_from_id, to_cpu, to_gpu)
