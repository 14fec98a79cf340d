#!/usr/bin/env python3
"""Data-parallel training of an MLP on MNIST / Fashion-MNIST: ChainerMN's train_mnist.py, in
kusari's names. The C++ example examples/mnist/train_mnist.cc is the same program; with the same
seed and flags both reach the same accuracy.

    mpiexec -n 2 python3 examples/python/train_mnist.py                                   # CPUs
    mpiexec -n 8 python3 examples/python/train_mnist.py -g --communicator pure_nccl       # GPUs
"""

import argparse
import os
import sys

import kusari
import kusari.functions as F
import kusari.links as L
import kusari.mn
from kusari import training
from kusari.training import extensions


class MLP(kusari.Chain):
    """784 -> n_units -> n_units -> n_out, ReLU in between."""

    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            # the size of the inputs to each layer is inferred
            self.l1 = L.Linear(None, n_units)  # n_in -> n_units
            self.l2 = L.Linear(None, n_units)  # n_units -> n_units
            self.l3 = L.Linear(None, n_out)  # n_units -> n_out

    def forward(self, x):
        h1 = F.relu(self.l1(x))
        h2 = F.relu(self.l2(h1))
        return self.l3(h2)


def main():
    parser = argparse.ArgumentParser(description='kusari example: data-parallel MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=100, help='Number of images in each mini-batch')
    parser.add_argument('--communicator', type=str, default='pure_nccl', help='Type of communicator')
    parser.add_argument('--epoch', '-e', type=int, default=20, help='Number of sweeps over the dataset to train')
    parser.add_argument('--gpu', '-g', action='store_true', help='Use GPU')
    parser.add_argument('--out', '-o', default='result', help='Directory to output the result')
    parser.add_argument('--resume', '-r', default='',
                        help='Resume the training from snapshot; a folder (or the --out folder): its newest complete '
                             'snapshot set, or a fresh start when there is none')
    parser.add_argument('--elastic', action='store_true',
                        help='Every process takes its part of each global batch of one order of the whole training '
                             'set, so that a snapshot resumes on another number of processes (kusari-run)')
    parser.add_argument('--snapshot-interval', type=int, default=0,
                        help='Take a snapshot of every process every this many iterations (0: none)')
    parser.add_argument('--unit', '-u', type=int, default=1000, help='Number of units')
    parser.add_argument('--data', default=None,
                        help='Folder of the MNIST IDX files; default: Fashion-MNIST (Debian\'s dataset-fashion-mnist)')
    parser.add_argument('--seed', type=int, default=0, help='Seed of the initial weights and the shuffling')
    parser.add_argument('--noplot', action='store_true', help='Disable PlotReport extension')
    parser.add_argument('--cuda-graph', action='store_true', help='With --gpu: replay each step as a CUDA graph')
    args = parser.parse_args()
    for name in ('batchsize', 'epoch', 'unit'):
        if getattr(args, name) <= 0:
            parser.error('--{} must be a positive number, got {}'.format(name, getattr(args, name)))
    if args.snapshot_interval < 0:
        parser.error('--snapshot-interval must be 0 (none) or a positive number, got {}'.format(args.snapshot_interval))
    if args.cuda_graph and not args.gpu:
        parser.error('--cuda-graph records GPU work; add --gpu')
    if kusari.only_check_arguments():  # KUSARI_CHECK_ARGS: the arguments only
        return

    # Prepare ChainerMN communicator: a GPU one with --gpu, 'naive' on CPUs.       (multi-node)
    if args.gpu:
        if args.communicator == 'naive':
            parser.error("'naive' communicator does not support GPU; use e.g. --communicator pure_nccl")
        comm = kusari.mn.create_communicator(args.communicator)
        device = kusari.Device('cuda:{}'.format(comm.intra_rank))
    else:
        if args.communicator not in ('naive', 'flat', 'dummy'):
            args.communicator = 'naive'
        comm = kusari.mn.create_communicator(args.communicator)
        device = kusari.Device('cpu')

    # On CPUs the matrix products (BLAS) get the cores; the small elementwise kernels of this MLP
    # run best on one thread (as the C++ example does).
    if 'OMP_NUM_THREADS' not in os.environ:
        kusari.set_num_threads(1)
    kusari.set_blas_num_threads(max(1, (os.cpu_count() or 1) // comm.intra_size))

    if comm.rank == 0:
        print('==========================================')
        print('Num process (COMM_WORLD): {}'.format(comm.size))
        if args.gpu:
            print('Using GPUs')
        print('Using {} communicator'.format(args.communicator))
        print('Num unit: {}'.format(args.unit))
        print('Num Minibatch-size: {}'.format(args.batchsize))
        print('Num epoch: {}'.format(args.epoch))
        print('==========================================')
        sys.stdout.flush()

    kusari.manual_seed(args.seed)
    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)

    # Create a multi node optimizer from a standard optimizer.                        (multi-node)
    optimizer = kusari.mn.create_multi_node_optimizer(kusari.optimizers.Adam(), comm)
    optimizer.setup(model)

    # Split and distribute the dataset. Only worker 0 loads the whole dataset.         (multi-node)
    # (With --elastic every worker loads it and keeps the whole training set.)
    if comm.rank == 0 or args.elastic:
        if args.data:
            train, test = kusari.datasets.get_mnist(directory=args.data)
        else:
            train, test = kusari.datasets.get_fashion_mnist()
    else:
        train, test = None, None
    if not args.elastic:
        train = kusari.mn.scatter_dataset(train, comm, shuffle=True)
    test = kusari.mn.scatter_dataset(test, comm, shuffle=True)

    if args.elastic:
        train_iter = kusari.mn.DistributedIterator(train, args.batchsize, comm)
    else:
        train_iter = kusari.iterators.SerialIterator(train, args.batchsize)
    test_iter = kusari.iterators.SerialIterator(test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    if args.cuda_graph:
        updater.set_use_cuda_graph(True)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # Create a multi node evaluator from a standard evaluator.                         (multi-node)
    evaluator = extensions.Evaluator(test_iter, model, device=device)
    evaluator = kusari.mn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator)

    # Some display and output extensions are necessary only for one worker.
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        if not args.noplot:
            trainer.extend(extensions.PlotReport(['main/loss', 'validation/main/loss'], 'epoch',
                                                 file_name='loss.png'))
            trainer.extend(extensions.PlotReport(['main/accuracy', 'validation/main/accuracy'], 'epoch',
                                                 file_name='accuracy.png'))
        trainer.extend(extensions.PrintReport(['epoch', 'main/loss', 'validation/main/loss', 'main/accuracy',
                                               'validation/main/accuracy', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar())

    if args.snapshot_interval > 0:
        trainer.extend(kusari.mn.multi_node_snapshot(comm, extensions.snapshot()),
                       trigger=(args.snapshot_interval, 'iteration'))

    # -r naming a folder, or the --out folder even before it exists: its newest complete snapshot set.
    if kusari.mn.names_snapshot_folder(args.resume, args.out):
        kusari.mn.load_newest_snapshot_set(args.resume, trainer, comm)
    elif args.resume:
        kusari.mn.load_snapshot_of_each_rank(args.resume, trainer, comm)

    trainer.run()
    if comm.rank == 0:
        kusari.serializers.save_npz(args.out + '/mlp.npz', model.predictor)


if __name__ == '__main__':
    main()
