"""The training loop from Python: datasets written in Python, iterators, the Trainer with C++ and
Python extensions and triggers, updaters subclassed in Python, snapshots, errors and Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kusari
import kusari.functions as F
import kusari.links as L
from kusari import training
from kusari.training import extensions


def toy_data(n=64, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 4).astype(np.float32)
    t = (x[:, 0] > 0).astype(np.int32)
    return x, t


class Net(kusari.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(4, 16)
            self.l2 = L.Linear(16, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def test_python_sequences_as_datasets():
    x, t = toy_data(10)
    pairs = [(x[i], t[i]) for i in range(10)]
    it = kusari.iterators.SerialIterator(pairs, 4, repeat=False, shuffle=False)
    batches = list(it)
    assert [len(b) for b in batches] == [4, 4, 2]
    bx, bt = kusari.datasets.concat_examples(batches[0])
    np.testing.assert_array_equal(bx, x[:4])
    np.testing.assert_array_equal(bt, t[:4])

    class Squares(kusari.datasets.DatasetMixin):
        def __len__(self):
            return 5

        def get_example(self, i):
            return np.float32(i * i), np.int32(i)
    sq = kusari.iterators.SerialIterator(Squares(), 5, shuffle=False).next()
    assert [float(e[0]) for e in sq] == [0, 1, 4, 9, 16]
    td = kusari.datasets.TupleDataset(x, t)
    assert len(td) == 10 and np.array_equal(td[3][0], x[3])
    a, b = kusari.datasets.split_dataset_random(td, 7, seed=0)
    assert len(a) == 7 and len(b) == 3


def test_trainer_with_python_extensions_triggers_and_report(tmp_path):
    x, t = toy_data()
    model = L.Classifier(Net())
    opt = kusari.optimizers.Adam(alpha=0.01)
    opt.setup(model)
    it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), 16)
    updater = training.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (3, 'epoch'), out=str(tmp_path))
    calls = {'class': 0, 'func': 0, 'init': 0}

    class Counter(training.Extension):
        trigger = (1, 'epoch')

        def initialize(self, trainer):
            calls['init'] += 1

        def __call__(self, trainer):
            calls['class'] += 1
            training.report({'custom': 2.5})

    @training.make_extension(trigger=(2, 'iteration'), priority=training.PRIORITY_WRITER)
    def every_other(trainer):
        calls['func'] += 1

    trainer.extend(Counter())
    trainer.extend(every_other)
    trainer.extend(lambda tr: None, name='plain', trigger=lambda tr: tr.updater.iteration % 5 == 0)
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.observe_lr())
    trainer.run()
    assert calls == {'class': 3, 'func': 6, 'init': 1}
    log = json.load(open(os.path.join(str(tmp_path), 'log')))
    assert len(log) == 3 and log[-1]['epoch'] == 3 and log[-1]['iteration'] == 12
    assert {'main/loss', 'main/accuracy', 'custom', 'lr', 'elapsed_time'} <= set(log[-1])
    assert log[-1]['main/loss'] < log[0]['main/loss']
    assert isinstance(trainer.get_extension('Counter'), Counter)


def test_updater_subclass_with_two_optimizers():
    x, t = toy_data()
    a, b = L.Classifier(Net()), L.Classifier(Net())
    oa, ob = kusari.optimizers.SGD(0.1), kusari.optimizers.SGD(0.1)
    oa.setup(a)
    ob.setup(b)

    class TwoModels(training.StandardUpdater):
        def update_core(self):
            batch = self.get_iterator('main').next()
            bx, bt = self.converter(batch, self.device)
            for name in ('a', 'b'):
                opt = self.get_optimizer(name)
                opt.update(opt.target, bx, bt)

    it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), 8)
    updater = TwoModels(it, {'a': oa, 'b': ob})
    trainer = training.Trainer(updater, (5, 'iteration'))
    trainer.run()
    assert oa.t == 5 and ob.t == 5 and updater.iteration == 5
    with pytest.raises(KeyError, match="no optimizer 'c'"):
        updater.get_optimizer('c')


def test_snapshot_and_resume(tmp_path):
    def make(out):
        x, t = toy_data()
        model = L.Classifier(Net())
        opt = kusari.optimizers.Adam()
        opt.setup(model)
        it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), 16, seed=1)
        trainer = training.Trainer(training.StandardUpdater(it, opt), (4, 'epoch'), out=out)
        trainer.extend(extensions.snapshot(), trigger=(2, 'epoch'))
        trainer.extend(extensions.LogReport())
        return trainer, model

    kusari.manual_seed(5)
    whole, model_whole = make(str(tmp_path / 'whole'))
    whole.run()
    kusari.manual_seed(5)
    part, _ = make(str(tmp_path / 'part'))
    kusari.serializers.load_npz(str(tmp_path / 'whole' / 'snapshot_iter_8'), part)
    assert part.updater.iteration == 8
    part.run()
    log_whole = json.load(open(str(tmp_path / 'whole' / 'log')))
    log_part = json.load(open(str(tmp_path / 'part' / 'log')))
    assert log_part[-1]['main/loss'] == log_whole[-1]['main/loss']


def test_exception_in_an_extension_propagates():
    x, t = toy_data()
    model = L.Classifier(Net())
    opt = kusari.optimizers.SGD()
    opt.setup(model)
    it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), 16)
    trainer = training.Trainer(training.StandardUpdater(it, opt), (2, 'epoch'))

    def broken(trainer):
        raise ZeroDivisionError('in an extension')
    trainer.extend(broken)
    with pytest.raises(ZeroDivisionError, match='in an extension'):
        trainer.run()


def test_ctrl_c_stops_a_cpp_training_loop(tmp_path):
    script = textwrap.dedent('''
        import sys, numpy as np, kusari, kusari.links as L
        from kusari import training
        x = np.random.rand(256, 64).astype(np.float32); t = np.zeros(256, np.int32)
        model = L.Classifier(L.Linear(64, 2)); opt = kusari.optimizers.SGD(); opt.setup(model)
        it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), 32)
        trainer = training.Trainer(training.StandardUpdater(it, opt), (10**9, 'iteration'))
        print('running', flush=True)
        try:
            trainer.run()
        except KeyboardInterrupt:
            print('stopped at iteration', trainer.updater.iteration, flush=True)
            sys.exit(3)
    ''')
    p = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'running'
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 3, out
    assert 'stopped at iteration' in out
