"""Arrays between NumPy and kusari (Note [Arrays between NumPy and kusari]): no copies on the CPU,
DLPack, dtypes, devices, and the errors of bad input."""

import numpy as np
import pytest

import kusari
import kusari.functions as F


def test_numpy_in_without_copy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = kusari.Variable(a)
    a[1, 2] = 42
    assert v.array[1, 2] == 42
    assert np.shares_memory(v.array, a)


def test_array_out_views_the_variables_memory():
    v = kusari.Variable(np.zeros((2, 2), np.float32))
    view = v.array
    view[0, 0] = 7
    assert v.array[0, 0] == 7
    # The view keeps the memory alive after the variable is gone.
    del v
    assert view[0, 0] == 7


def test_strided_and_transposed_numpy_arrays():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for x in (a[:, ::2], a.T, a[::-1], a[1:3, 2:5]):
        y = F.relu(x)
        np.testing.assert_array_equal(y.array, np.maximum(x, 0))
    v = kusari.Variable(a[::-1])
    assert np.shares_memory(v.array, a)


def test_dtypes():
    for dt in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_):
        v = kusari.Variable(np.zeros(3, dt), requires_grad=False)
        assert v.dtype == np.dtype(dt)
    # int8 and int16 are widened to int32 (a copy); complex numbers are refused naming the dtype.
    assert kusari.Variable(np.zeros(2, np.int16)).dtype == np.int32
    with pytest.raises(TypeError, match='complex128'):
        kusari.Variable(np.zeros(2, np.complex128))


def test_bfloat16_comes_back_as_kusari_array():
    x = F.cast(np.array([1.5, -2.25], np.float32), 'bfloat16')
    assert x.dtype == 'bfloat16'
    assert isinstance(x.array, kusari.ndarray)
    np.testing.assert_array_equal(x.array.get(), [1.5, -2.25])
    np.testing.assert_array_equal(np.asarray(x.array), [1.5, -2.25])


def test_lists_and_scalars():
    v = kusari.Variable([[1, 2], [3, 4.5]])
    assert v.dtype == np.float32 and v.shape == (2, 2)
    assert F.sum(np.float32(3) * v).item() == pytest.approx(31.5)


def test_dlpack_round_trip_with_numpy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    k = kusari.from_dlpack(a)
    assert isinstance(k, kusari.ndarray) and k.shape == (3, 4)
    back = np.from_dlpack(k)
    a[0, 0] = -1
    assert back[0, 0] == -1  # one memory throughout
    assert k.__dlpack_device__() == (1, 0)
    # The 2023 protocol's keywords (NumPy 2 and PyTorch 2 pass them first).
    same = np.from_dlpack(kusari.from_dlpack(k.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)))
    assert same[0, 0] == -1
    copied = kusari.from_dlpack(k.__dlpack__(copy=True))
    a[0, 1] = -7
    assert copied.get()[0, 1] == 1
    with pytest.raises(BufferError, match="dl_device"):
        k.__dlpack__(dl_device=(2, 0))


def test_numpy_views_a_kusari_array():
    a = np.arange(4, dtype=np.int64)
    k = kusari.asarray(a)
    v = np.asarray(k)
    np.testing.assert_array_equal(v, [0, 1, 2, 3])
    assert np.shares_memory(v, a)  # kusari.asarray took the NumPy memory, numpy.asarray gives it back


def test_devices():
    assert kusari.Device('cpu').is_cpu
    assert str(kusari.Device('@cupy:1')) == 'cuda:1'
    assert kusari.Device(-1) == 'cpu'
    assert kusari.Device(2) == kusari.Device('cuda:2')
    with pytest.raises(ValueError):
        kusari.Device('tpu:0')
    if not kusari.cuda_available():
        with pytest.raises(RuntimeError, match='CUDA'):
            kusari.asarray(np.zeros(2), device='cuda:0')


def test_errors_name_the_function_and_values():
    with pytest.raises(ValueError, match='matmul'):
        F.matmul(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32))
    with pytest.raises(TypeError, match='relu'):
        F.relu('not an array')
    with pytest.raises(IndexError):
        kusari.Variable(np.zeros(3, np.float32))[[0, 1]]
