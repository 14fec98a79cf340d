#!/usr/bin/env python3
"""Data-parallel DCGAN on Fashion-MNIST: ChainerMN's dcgan example, in kusari's names (the C++
example examples/dcgan/train_dcgan.cc is the same program). Two models, two multi-node optimizers
and an updater, written in Python, that takes a step of each per batch.

    mpiexec -n 2 python3 examples/python/train_dcgan.py                              # CPUs
    mpiexec -n 8 python3 examples/python/train_dcgan.py -g --communicator pure_nccl  # GPUs

Every epoch rank 0 writes a 10x10 grid of samples from fixed noise to <out>/preview/.
"""

import argparse
import os

import numpy as np

import kusari
import kusari.functions as F
import kusari.links as L
import kusari.mn
from kusari import training
from kusari.training import extensions


def w_init():
    return kusari.initializers.Normal(0.02)


class Generator(kusari.Chain):
    """z (N, n_hidden) -> Linear -> BN -> ReLU -> (ch, 7, 7) -> Deconv -> BN -> ReLU -> Deconv -> sigmoid."""

    def __init__(self, n_hidden, ch=128):
        super().__init__()
        self.n_hidden, self.ch = n_hidden, ch
        with self.init_scope():
            self.l0 = L.Linear(n_hidden, 7 * 7 * ch, initialW=w_init())
            self.bn0 = L.BatchNormalization(7 * 7 * ch)
            self.dc1 = L.Deconvolution2D(ch, ch // 2, 4, 2, 1, initialW=w_init())
            self.bn1 = L.BatchNormalization(ch // 2)
            self.dc2 = L.Deconvolution2D(ch // 2, 1, 4, 2, 1, initialW=w_init())

    def make_hidden(self, n, rng):
        return rng.randn(n, self.n_hidden).astype(np.float32)

    def forward(self, z):
        h = F.reshape(F.relu(self.bn0(self.l0(z))), (z.shape[0], self.ch, 7, 7))
        h = F.relu(self.bn1(self.dc1(h)))
        return F.sigmoid(self.dc2(h))


class Discriminator(kusari.Chain):
    """x (N, 1, 28, 28) -> Conv -> LeakyReLU -> Conv -> BN -> LeakyReLU -> Linear: one logit per image."""

    def __init__(self, ch=128):
        super().__init__()
        with self.init_scope():
            self.c0 = L.Convolution2D(1, ch // 2, 4, 2, 1, initialW=w_init())
            self.c1 = L.Convolution2D(ch // 2, ch, 4, 2, 1, initialW=w_init())
            self.bn1 = L.BatchNormalization(ch)
            self.l2 = L.Linear(7 * 7 * ch, 1, initialW=w_init())

    def forward(self, x):
        h = F.leaky_relu(self.c0(x))
        h = F.leaky_relu(self.bn1(self.c1(h)))
        return self.l2(h)


class DCGANUpdater(training.StandardUpdater):
    """Per batch: a discriminator step on real and generated images, then a generator step."""

    def __init__(self, iterator, optimizers, device, seed):
        super().__init__(iterator, optimizers, device=device)
        self.rng = np.random.RandomState(seed)

    def update_core(self):
        gen_opt, dis_opt = self.get_optimizer('gen'), self.get_optimizer('dis')
        gen, dis = gen_opt.target, dis_opt.target
        x_real = self.converter(self.get_iterator('main').next(), self.device)
        if isinstance(x_real, tuple):
            x_real = x_real[0]
        z = kusari.asarray(gen.make_hidden(len(x_real), self.rng), device=self.device)
        x_fake = gen(z)

        def dis_loss():
            y_real, y_fake = dis(x_real), dis(x_fake.detach())
            loss = F.mean(F.softplus(-y_real)) + F.mean(F.softplus(y_fake))
            kusari.report({'dis/loss': loss})
            return loss

        def gen_loss():
            loss = F.mean(F.softplus(-dis(x_fake)))
            kusari.report({'gen/loss': loss})
            return loss

        dis_opt.update(dis_loss)
        gen_opt.update(gen_loss)


def preview(gen, z, rows, out):
    @training.make_extension(trigger=(1, 'epoch'))
    def write(trainer):
        with kusari.no_backprop_mode(), kusari.using_config('train', False):
            x = np.asarray(kusari.asarray(gen(z).array, device='cpu'))
        grid = x.reshape(rows, rows, 28, 28).transpose(0, 2, 1, 3).reshape(rows * 28, rows * 28)
        path = os.path.join(out, 'preview', 'image_epoch_{}.png'.format(trainer.updater.epoch))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        kusari.datasets.write_image(path, (np.clip(grid, 0, 1) * 255 + 0.5).astype(np.uint8))
        print('preview {}: pixel standard deviation {:.4f}'.format(path, grid.std()), flush=True)
    return write


def main():
    parser = argparse.ArgumentParser(description='kusari example: data-parallel DCGAN on Fashion-MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=50)
    parser.add_argument('--communicator', type=str, default='pure_nccl')
    parser.add_argument('--epoch', '-e', type=int, default=20)
    parser.add_argument('--gpu', '-g', action='store_true')
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--n_hidden', '--n-hidden', '-n', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--train-size', type=int, default=0, help='Train on the first N images only (0: all)')
    args = parser.parse_args()
    for name in ('batchsize', 'epoch', 'n_hidden'):
        if getattr(args, name) <= 0:
            parser.error('--{} must be a positive number, got {}'.format(name, getattr(args, name)))
    if kusari.only_check_arguments():  # KUSARI_CHECK_ARGS: the arguments only
        return

    if args.gpu:
        comm = kusari.mn.create_communicator(args.communicator)
        device = kusari.Device('cuda:{}'.format(comm.intra_rank))
    else:
        comm = kusari.mn.create_communicator('naive')
        device = kusari.Device('cpu')
    if 'OMP_NUM_THREADS' not in os.environ:
        kusari.set_num_threads(1)
    if comm.rank == 0:
        print('Num process (COMM_WORLD): {}, minibatch {}, epochs {}'.format(comm.size, args.batchsize, args.epoch))

    kusari.manual_seed(args.seed)
    gen, dis = Generator(args.n_hidden), Discriminator()
    gen.to_device(device)
    dis.to_device(device)

    def make_optimizer(model):                                                        # (multi-node)
        opt = kusari.mn.create_multi_node_optimizer(kusari.optimizers.Adam(alpha=0.0002, beta1=0.5), comm)
        opt.setup(model)
        opt.add_hook(kusari.optimizer_hooks.WeightDecay(0.0001))
        return opt
    gen_opt, dis_opt = make_optimizer(gen), make_optimizer(dis)

    if comm.rank == 0:
        train, _ = kusari.datasets.get_fashion_mnist(withlabel=False, ndim=3)
        if args.train_size:
            train = kusari.datasets.SubDataset(train, 0, min(args.train_size, len(train)))
    else:
        train = None
    train = kusari.mn.scatter_dataset(train, comm, shuffle=True)                       # (multi-node)
    train_iter = kusari.iterators.SerialIterator(train, args.batchsize)
    updater = DCGANUpdater(train_iter, {'gen': gen_opt, 'dis': dis_opt}, device, args.seed * 1000 + comm.rank)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    if comm.rank == 0:
        rows = 10
        z = kusari.asarray(gen.make_hidden(rows * rows, np.random.RandomState(args.seed)), device=device)
        trainer.extend(preview(gen, z, rows, args.out))
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(['epoch', 'iteration', 'gen/loss', 'dis/loss', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar(update_interval=50))
    trainer.run()


if __name__ == '__main__':
    main()
