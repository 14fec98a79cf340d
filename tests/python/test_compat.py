"""kusari.compat: Chainer's and ChainerMN's module names, by import and under `-m kusari.compat`."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest


def test_modules_by_name():
    from kusari.compat import chainer, chainermn
    import kusari
    assert chainer.Chain is kusari.Chain and chainer.functions.relu is kusari.functions.relu
    assert chainermn.create_communicator is kusari.mn.create_communicator
    assert chainer.datasets.TupleDataset is kusari.datasets.TupleDataset
    dev = chainer.cuda.get_device_from_id(-1)
    assert dev.id == -1 and dev.use() is dev


def run_script(tmp_path, body):
    path = tmp_path / 'script.py'
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, '-m', 'kusari.compat', str(path), 'arg1'], capture_output=True, text=True)


def test_an_unmodified_script_sees_chainer(tmp_path):
    p = run_script(tmp_path, '''
        import sys
        import chainer, chainer.functions as F, chainer.links as L
        from chainer import training
        from chainer.training import extensions
        from chainer.dataset import convert
        import chainermn
        import numpy as np
        assert sys.argv[1:] == ['arg1'], sys.argv
        class M(chainer.Chain):
            def __init__(self):
                super(M, self).__init__()
                with self.init_scope():
                    self.l = L.Linear(None, 2)
            def __call__(self, x):
                return self.l(x)
        y = M()(np.ones((3, 4), np.float32))
        print('ok', y.shape, chainer.config.train, convert.concat_examples([(1, 2)])[0].shape)
    ''')
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == 'ok (3, 2) True (1,)'


def test_what_is_not_there_is_named(tmp_path):
    p = run_script(tmp_path, '''
        import chainer.links.model.vision.vgg
    ''')
    assert p.returncode != 0
    assert 'chainer.links.model is not supported' in p.stderr and 'docs/python.md' in p.stderr


def test_get_mnist_says_where_the_files_go(tmp_path, monkeypatch):
    import kusari
    monkeypatch.setenv('KUSARI_DATASET_ROOT', str(tmp_path))
    with pytest.raises(OSError, match='mnist'):
        kusari.datasets.get_mnist()
