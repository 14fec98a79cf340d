"""python3 -m kusari.compat SCRIPT [ARGS...]: runs a Chainer or ChainerMN script on kusari."""

import os
import runpy
import sys

from kusari import compat


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ('-h', '--help'):
        print('usage: python3 -m kusari.compat SCRIPT [ARGS...]\n\n'
              'Runs an unmodified Chainer or ChainerMN script on kusari: `chainer` and `chainermn` resolve to\n'
              "kusari's compatibility modules (docs/python.md). Under mpiexec: mpiexec -n 2 python3 -m "
              'kusari.compat train_mnist.py', file=sys.stderr)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    script = sys.argv[1]
    if not os.path.isfile(script):
        print('kusari.compat: no script {!r}'.format(script), file=sys.stderr)
        sys.exit(2)
    compat.install()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name='__main__')


main()
