#!/usr/bin/env python3
"""Integration checks of the Python package that run whole programs (CTest python_*):

  run_checks.py chainer-mnist --np N --mpiexec M --script chainer_train_mnist.py --work DIR
      an unmodified Chainer-style script through `python3 -m kusari.compat` trains and writes
      Chainer's outputs (log, cg.dot);
  run_checks.py same-as-cpp --np N --mpiexec M --script train_mnist.py --cpp train_mnist --work DIR
      the Python example and the C++ one, same seed and flags, write the same log;
  run_checks.py failure --mpiexec M --script failing_rank.py --work DIR
      a Python exception on one rank (or every rank) ends the job with one report.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

FASHION = [os.path.join(os.environ['KUSARI_DATASET_ROOT'], 'fashion-mnist')] if os.environ.get(
    'KUSARI_DATASET_ROOT') else []
FASHION.append('/usr/share/datasets/fashion-mnist')


def fashion_dir():
    for d in FASHION:
        if os.path.exists(os.path.join(d, 'train-images-idx3-ubyte.gz')) or os.path.exists(
                os.path.join(d, 'train-images-idx3-ubyte')):
            return d
    print('SKIP: Fashion-MNIST is not installed (looked in {})'.format(FASHION))
    sys.exit(0)


def launcher(args, np_):
    if np_ == 1:
        return []
    version = subprocess.run([args.mpiexec, '--version'], capture_output=True, text=True).stdout
    flags = ['--oversubscribe'] if ('Open MPI' in version or 'OpenRTE' in version) else []
    return [args.mpiexec, '-n', str(np_)] + flags


def run(cmd, env=None, timeout=240):
    print('$', ' '.join(cmd), flush=True)
    start = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    print(p.stdout)
    print('--- exit status {} after {:.1f} s'.format(p.returncode, time.monotonic() - start), flush=True)
    return p


def fail(message):
    print('FAIL: ' + message)
    sys.exit(1)


def read_log(path):
    with open(path) as f:
        log = json.load(f)
    for entry in log:
        entry.pop('elapsed_time', None)
    return log


def chainer_mnist(args):
    data = fashion_dir()
    shutil.rmtree(args.work, ignore_errors=True)
    root = os.path.join(args.work, 'datasets')
    os.makedirs(os.path.join(root, 'mnist'))
    for name in os.listdir(data):
        os.symlink(os.path.join(data, name), os.path.join(root, 'mnist', name))
    env = dict(os.environ, KUSARI_DATASET_ROOT=root)
    out = os.path.join(args.work, 'result')
    p = run(launcher(args, args.np) + [sys.executable, '-m', 'kusari.compat', args.script, '-e', '1', '-u', '100',
                                       '-o', out], env)
    if p.returncode != 0:
        fail('the Chainer script failed under kusari.compat')
    log = json.load(open(os.path.join(out, 'log')))
    if len(log) != 1 or set(log[0]) < {'main/loss', 'validation/main/loss', 'main/accuracy',
                                        'validation/main/accuracy', 'epoch', 'iteration', 'elapsed_time'}:
        fail('the log is not Chainer\'s list of one epoch with its keys: {}'.format(log))
    if log[0]['validation/main/accuracy'] < 0.7:
        fail('validation accuracy {} after an epoch; expected above 0.7'.format(log[0]['validation/main/accuracy']))
    dot = open(os.path.join(out, 'cg.dot')).read()
    if 'softmax_cross_entropy' not in dot or dot.count('linear') < 3:
        fail('DumpGraph wrote no graph of the MLP:\n' + dot)
    print('PASS')


def same_as_cpp(args):
    fashion_dir()
    shutil.rmtree(args.work, ignore_errors=True)
    flags = ['-e', '1', '-u', '50', '--noplot', '--seed', '3']
    py_out, cpp_out = os.path.join(args.work, 'python'), os.path.join(args.work, 'cpp')
    p = run(launcher(args, args.np) + [sys.executable, args.script] + flags + ['-o', py_out])
    if p.returncode != 0:
        fail('the Python example failed')
    c = run(launcher(args, args.np) + [args.cpp] + flags + ['-o', cpp_out])
    if c.returncode != 0:
        fail('the C++ example failed')
    a, b = read_log(os.path.join(py_out, 'log')), read_log(os.path.join(cpp_out, 'log'))
    if a != b:
        fail('the logs differ:\nPython {}\nC++    {}'.format(a, b))
    print('the same log: {}'.format(a))
    print('PASS')


def failure(args):
    shutil.rmtree(args.work, ignore_errors=True)
    for np_, extra, once in ((2, [], ['rank 1 of 2 on host', 'RuntimeError: python failure at step 3\n']),
                             (3, ['--all'], ['ranks 0, 1 and 2 of 3 on host',
                                             'RuntimeError: python failure at step 3 on every rank'])):
        p = run(launcher(args, np_) + [sys.executable, args.script] + extra, timeout=60)
        if p.returncode == 0:
            fail('the job must exit with a non-zero status')
        for text in once + ['[kusari.mn] the job ends: exit status 1']:
            n = p.stdout.count(text)
            if n != 1:
                fail('{!r} appears {} times in the output; expected once'.format(text, n))
        for text in ('MPI_ABORT', 'finished without noticing', 'Traceback (most recent call last)\nTraceback'):
            if text in p.stdout:
                fail('{!r} must not appear in the output'.format(text))
        if 'Traceback (most recent call last)' not in p.stdout:
            fail('the report must carry the Python traceback')
    print('PASS')


def example(args):
    """A Python example runs to its end and writes its log (with --out <work>/result)."""
    if args.needs_fashion_mnist:
        fashion_dir()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    out = os.path.join(args.work, 'result')
    if args.make_images:
        p = run([args.make_images, '--out', os.path.join(args.work, 'images'), '--size', '32', '--train', '192',
                 '--val', '64'])
        if p.returncode != 0:
            fail('make_image_folder failed')
    extra = [a.replace('{work}', args.work) for a in args.rest]
    p = run(launcher(args, args.np) + [sys.executable, args.script] + extra + ['-o', out], timeout=280)
    if p.returncode != 0:
        fail('the example failed')
    log = json.load(open(os.path.join(out, 'log')))
    if not log or any(v != v for entry in log for v in entry.values() if isinstance(v, float)):
        fail('the log is empty or has NaN: {}'.format(log))
    print('PASS')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('check', choices=['chainer-mnist', 'same-as-cpp', 'failure', 'example'])
    ap.add_argument('--needs-fashion-mnist', action='store_true')
    ap.add_argument('--make-images', help='make_image_folder: write a small image folder into <work>/images first')
    ap.add_argument('--np', type=int, default=1)
    ap.add_argument('--mpiexec', default='mpiexec')
    ap.add_argument('--script', required=True)
    ap.add_argument('--cpp')
    ap.add_argument('--work', required=True)
    argv = sys.argv[1:]
    rest = argv[argv.index('--') + 1:] if '--' in argv else []
    args = ap.parse_args(argv[:argv.index('--')] if '--' in argv else argv)
    args.rest = rest  # (example) the example's arguments, after --
    {'chainer-mnist': chainer_mnist, 'same-as-cpp': same_as_cpp, 'failure': failure,
     'example': example}[args.check](args)


if __name__ == '__main__':
    main()
