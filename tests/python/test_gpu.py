"""The Python package on a GPU (skipped without one): device arrays, DLPack with PyTorch and CuPy
(no copies), a training step equal to the CPU's, and CUDA-graph replay driven from Python."""

import numpy as np
import pytest

import kusari
import kusari.functions as F
import kusari.links as L
from kusari import training

pytestmark = pytest.mark.skipif(not kusari.cuda_available(), reason='no GPU on this machine')
GPU = 'cuda:0'


def test_gpu_arrays_come_back_as_kusari_arrays():
    x = kusari.Variable(kusari.asarray(np.arange(6, dtype=np.float32), device=GPU))
    y = F.relu(x - 2)
    assert isinstance(y.array, kusari.ndarray) and y.array.device == kusari.Device(GPU)
    np.testing.assert_array_equal(y.array.get(), np.maximum(np.arange(6) - 2, 0))
    F.sum(y * y).backward()
    np.testing.assert_array_equal(x.grad.get(), 2 * np.maximum(np.arange(6) - 2, 0))


def test_dlpack_with_pytorch_shares_memory():
    torch = pytest.importorskip('torch')
    t = torch.arange(8, dtype=torch.float32, device='cuda')
    k = kusari.from_dlpack(t)
    assert k.device == kusari.Device(GPU)
    t[0] = 42
    torch.cuda.synchronize()
    assert k.get()[0] == 42
    back = torch.from_dlpack(F.relu(kusari.Variable(k) - 1).array)
    assert back.device.type == 'cuda' and back[1].item() == 0 and back[0].item() == 41


def test_dlpack_with_cupy():
    cupy = pytest.importorskip('cupy')
    c = cupy.arange(4, dtype=cupy.float32)
    k = kusari.from_dlpack(c)
    np.testing.assert_array_equal(k.get(), [0, 1, 2, 3])
    back = cupy.from_dlpack(k)
    assert int(back[3]) == 3


class MLP(kusari.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(20, 64)
            self.l2 = L.Linear(64, 5)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def train_steps(device, steps, cuda_graph=False):
    kusari.manual_seed(0)
    rng = np.random.RandomState(0)
    x = rng.randn(64, 20).astype(np.float32)
    t = rng.randint(0, 5, 64).astype(np.int32)
    model = L.Classifier(MLP())
    model.to_device(device)
    opt = kusari.optimizers.SGD(0.1)
    opt.setup(model)
    it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), 16, shuffle=False)
    updater = training.StandardUpdater(it, opt, device=device)
    updater.set_use_cuda_graph(cuda_graph)
    for _ in range(steps):
        updater.update()
    w = model.predictor.l1.W.array
    return np.asarray(w.get() if isinstance(w, kusari.ndarray) else w), updater


def test_a_step_on_the_gpu_equals_the_cpus():
    cpu, _ = train_steps('cpu', 8)
    gpu, _ = train_steps(GPU, 8)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-5)


def test_cuda_graph_replay_from_python():
    eager, _ = train_steps(GPU, 12)
    graphed, updater = train_steps(GPU, 12, cuda_graph=True)
    assert updater.graph_replays > 0
    np.testing.assert_allclose(graphed, eager, rtol=1e-4, atol=1e-5)
