"""Links from Python: Chains written in Python (init_scope, keyword arguments, forward or
__call__), ChainList, Sequential, parameters, persistents, and npz files."""

import os

import numpy as np
import pytest

import kusari
import kusari.functions as F
import kusari.links as L


class MLP(kusari.Chain):
    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(n_units, n_out)
            self.scale = kusari.Parameter(np.array([2.0], np.float32))
        self.not_registered = L.Linear(3)

    def forward(self, x):
        y = self.l2(F.relu(self.l1(x)))
        return y * F.broadcast_to(self.scale, y.shape)


def test_init_scope_registers_links_and_parameters(rng):
    m = MLP(4, 2)
    names = [n for n, _ in m.namedparams()]
    assert names == ['/scale', '/l1/W', '/l1/b', '/l2/W', '/l2/b'] or sorted(names) == sorted(
        ['/scale', '/l1/W', '/l1/b', '/l2/W', '/l2/b'])
    assert m.l1.W.array is None  # sized at the first call
    y = m(rng.randn(3, 5).astype(np.float32))
    assert y.shape == (3, 2) and m.l1.W.shape == (4, 5)
    assert m.count_params() == 4 * 5 + 4 + 2 * 4 + 2 + 1
    assert [type(c).__name__ for c in m.children()] == ['Linear', 'Linear']


def test_chainer_styles_keyword_links_and_call():
    class Old(kusari.Chain):
        def __init__(self):
            super().__init__(a=L.Linear(2, 3), b=L.Linear(3, 1))

        def __call__(self, x):
            return self.b(self.a(x))

    m = Old()
    assert sorted(n for n, _ in m.namedparams()) == ['/a/W', '/a/b', '/b/W', '/b/b']
    # Called by C++ (the Classifier's predictor) and from Python alike.
    x = np.ones((4, 2), np.float32)
    assert m(x).shape == (4, 1)
    loss = L.Classifier(m, lossfun=F.mean_squared_error, accfun=None)
    loss.compute_accuracy = False
    assert loss(x, np.zeros((4, 1), np.float32)).shape == ()


def test_a_chain_without_forward_is_named_in_the_error():
    class Nothing(kusari.Chain):
        pass
    with pytest.raises(TypeError, match='Nothing defines neither forward'):
        L.Classifier(Nothing())(np.ones((1, 2), np.float32), np.zeros(1, np.int32))
    with pytest.raises(TypeError, match='Nothing defines neither forward'):
        Nothing()(np.ones((1, 2), np.float32))


def test_chainlist_and_sequential(rng):
    cl = kusari.ChainList(L.Linear(3), L.Linear(2))
    assert len(cl) == 2 and [n for n, _ in cl.namedparams()] == ['/0/W', '/0/b', '/1/W', '/1/b']
    assert isinstance(cl[1], L.Linear) and len(list(cl)) == 2
    seq = kusari.Sequential(L.Linear(5), F.relu, L.Linear(1))
    assert seq(rng.randn(2, 3).astype(np.float32)).shape == (2, 1)
    assert len(seq.params()) == 4


def test_persistents_and_batch_normalization(rng):
    bn = L.BatchNormalization(3)
    x = rng.randn(8, 3).astype(np.float32) * 2 + 5
    bn(x)
    assert bn.avg_mean.shape == (3,) and (bn.avg_mean > 0).all()
    with kusari.using_config('train', False):
        y = bn(x)
    assert y.shape == (8, 3)
    link = kusari.Link()
    link.add_persistent('count', np.zeros(1, np.int64))
    assert link.count[0] == 0 and [p for p, _ in link.namedpersistents()] == ['/count']


def test_npz_round_trip_and_chainer_keys(tmp_path, rng):
    m = MLP(4, 2)
    m(rng.randn(1, 5).astype(np.float32))
    path = str(tmp_path / 'model.npz')
    kusari.serializers.save_npz(path, m)
    keys = sorted(np.load(path).files)
    assert keys == ['l1/W', 'l1/b', 'l2/W', 'l2/b', 'scale']
    m2 = MLP(4, 2)
    kusari.serializers.load_npz(path, m2)
    np.testing.assert_array_equal(m2.l1.W.array, m.l1.W.array)
    with pytest.raises(OSError, match='missing.npz'):
        kusari.serializers.load_npz(str(tmp_path / 'missing.npz'), m2)


def test_optimizer_update_with_lossfun_and_hooks(rng):
    m = L.Classifier(MLP(8, 3))
    opt = kusari.optimizers.MomentumSGD(lr=0.1)
    opt.setup(m)
    seen = []
    opt.add_hook(kusari.optimizer_hooks.WeightDecay(1e-4))
    opt.add_hook(lambda o: seen.append(o.t), name='spy')
    x, t = rng.randn(16, 5).astype(np.float32), rng.randint(0, 3, 16).astype(np.int32)
    first = m(x, t).item()
    for _ in range(20):
        opt.update(m, x, t)
    assert m(x, t).item() < first
    assert opt.t == 20 and seen == list(range(0, 20))
    opt.lr = 0.05
    assert opt.lr == pytest.approx(0.05)
    with pytest.raises(AttributeError, match='no attribute or hyperparameter'):
        opt.no_such_thing


def test_resnet_from_the_zoo():
    model = kusari.models.resnet18(num_classes=10, width=8)
    with kusari.using_config('train', False):
        y = model(np.zeros((1, 3, 32, 32), np.float32))
    assert y.shape == (1, 10)
