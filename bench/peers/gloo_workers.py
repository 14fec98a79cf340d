"""Worker processes for the benchmarks' PyTorch gloo peers (ddp_mnist, ddp_overlap, collectives).

run_workers(run, args, np) starts `np` spawned processes run(rank, args, port, queue), each bound
to as many CPUs as the benchmark's rank had (_bound), with a free rendezvous port, and returns
what rank 0 put on the queue; each spawned worker ends with leave(queue). With in_process=True
and np == 1, run is called in this process instead (it must not call leave then).
"""
import os
import socket

import torch.multiprocessing as mp


def free_port():
    """A free TCP port on the loopback interface for the rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bound(rank, run, args, port, queue):
    """run(rank, ...) bound as mpiexec bound the benchmark's rank that started the peer: to
    KUSARI_BENCH_CPUS_PER_WORKER CPUs (1 when unset), the rank-th such group of those this
    process may use."""
    cpus = sorted(os.sched_getaffinity(0))
    n = max(1, min(len(cpus), int(os.environ.get("KUSARI_BENCH_CPUS_PER_WORKER", "1"))))
    first = (rank * n) % len(cpus)
    os.sched_setaffinity(0, {cpus[(first + k) % len(cpus)] for k in range(n)})
    run(rank, args, port, queue)


def run_workers(run, args, np, in_process=False):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    if in_process and np == 1:
        run(0, args, port, queue)
        return queue.get()
    # Read the result before joining: a process that put something on a queue does not exit
    # until it has been read, so joining first can wait forever.
    workers = mp.start_processes(_bound, args=(run, args, port, queue), nprocs=np,
                                 start_method="spawn", join=False)
    result = queue.get()
    while not workers.join():
        pass
    return result


def leave(queue):
    """Ends a worker without tearing DDP and gloo down: on a 2-core machine a worker sometimes
    hung for good in their destructors once its peer had gone. The result is flushed first."""
    queue.close()
    queue.join_thread()
    os._exit(0)
