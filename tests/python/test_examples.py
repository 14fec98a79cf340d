"""The Python examples check their arguments before they read data or start a communicator:
KUSARI_CHECK_ARGS=1 stops them there (kusari.only_check_arguments), and bad values are refused
with the flag and the value named."""

import os
import subprocess
import sys

import pytest

import kusari

EXAMPLES = os.path.join(os.path.dirname(__file__), '..', '..', 'examples', 'python')
# (script, arguments it needs besides the flags tested)
SCRIPTS = [('train_mnist.py', []), ('train_dcgan.py', []), ('train_imagenet.py', ['train_list', 'val_list'])]


def run(script, args, tmp_path, check_only):
    env = dict(os.environ)
    env['KUSARI_CHECK_ARGS'] = '1' if check_only else '0'
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script)] + args, cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.mark.parametrize('script,needed', SCRIPTS)
def test_check_only_accepts_and_does_nothing(script, needed, tmp_path):
    p = run(script, needed + ['-o', 'out'], tmp_path, check_only=True)
    assert p.returncode == 0, p.stdout
    assert p.stdout.strip() == script + ': arguments accepted'
    assert os.listdir(tmp_path) == []  # no output folder, no data read


@pytest.mark.parametrize('script,needed', SCRIPTS)
def test_a_batch_size_of_zero_is_refused_by_name(script, needed, tmp_path):
    p = run(script, needed + ['--batchsize', '0'], tmp_path, check_only=True)
    assert p.returncode == 2
    assert '--batchsize must be a positive number, got 0' in p.stdout


def test_only_check_arguments_is_false_without_the_variable(monkeypatch, capsys):
    monkeypatch.delenv('KUSARI_CHECK_ARGS', raising=False)
    assert kusari.only_check_arguments('prog') is False
    monkeypatch.setenv('KUSARI_CHECK_ARGS', '1')
    assert kusari.only_check_arguments('prog') is True
