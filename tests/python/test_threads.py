"""The GIL is released while C++ runs: a Python thread keeps running during a long kernel."""

import threading
import time

import numpy as np

import kusari
import kusari.functions as F


def test_python_runs_while_a_kernel_runs():
    kusari.set_blas_num_threads(1)
    a = np.random.rand(1200, 1200).astype(np.float32)
    done = threading.Event()
    ticks = [0]

    def count():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    start = time.monotonic()
    before = ticks[0]
    for _ in range(20):
        F.matmul(a, a)
    spent = time.monotonic() - start
    during = ticks[0] - before
    done.set()
    counter.join()
    # With the GIL held by the products the counter would not move at all while they run; released,
    # it ticks about once per millisecond of them.
    assert spent > 0.05
    assert during >= 0.2 * spent * 1000, (during, spent)
