#!/usr/bin/env python3
"""Data-parallel ResNet training on ImageNet-layout images: ChainerMN's imagenet example, in
kusari's names (the C++ example examples/imagenet/train_imagenet.cc has every flag of the
large-minibatch recipe; this one keeps ChainerMN's shape). The images are decoded and augmented by
C++ threads (kusari.iterators.ImageLoader), the model is kusari's ResNet zoo.

    mpiexec -n 2 python3 examples/python/train_imagenet.py fashion_images/train fashion_images/val \\
        --arch resnet18 --size 32 -E 2                                              # CPUs
    mpiexec -n 8 python3 examples/python/train_imagenet.py imagenet/train imagenet/val -g \\
        --communicator pure_nccl --dtype bfloat16 --channels-last                   # GPUs

`train` and `val` are folders with one subfolder per class, or list files of 'path label' lines.
"""

import argparse
import os

import kusari
import kusari.functions as F
import kusari.links as L
import kusari.mn
from kusari import training
from kusari.training import extensions, triggers

ARCHS = ('resnet18', 'resnet34', 'resnet50', 'resnet101', 'resnet152')


def open_dataset(path, root):
    if os.path.isdir(path):
        return kusari.datasets.ImageFolderDataset(path)
    return kusari.datasets.LabeledImageDataset(path, root)


def main():
    parser = argparse.ArgumentParser(description='kusari example: data-parallel ResNet on ImageNet-layout images')
    parser.add_argument('train', help='Training images: a folder with one subfolder per class, or a list file')
    parser.add_argument('val', help='Validation images, as train')
    parser.add_argument('--root', '-R', default='.', help='Folder the relative paths of list files start from')
    parser.add_argument('--arch', '-a', choices=ARCHS, default='resnet50')
    parser.add_argument('--batchsize', '-B', type=int, default=32, help='Training mini-batch size (per process)')
    parser.add_argument('--val_batchsize', '--val-batchsize', '-b', type=int, default=250)
    parser.add_argument('--epoch', '-E', type=int, default=10)
    parser.add_argument('--loaderjob', '-j', type=int, default=0, help='Loader threads (0: the cores per process)')
    parser.add_argument('--gpu', '-g', action='store_true')
    parser.add_argument('--communicator', default='pure_nccl')
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--size', type=int, default=224, help='Crop size')
    parser.add_argument('--lr', type=float, default=0.1, help='Learning rate at a global batch of 256')
    parser.add_argument('--dtype', choices=('float32', 'bfloat16', 'float16'), default='float32')
    parser.add_argument('--channels-last', action='store_true')
    parser.add_argument('--checkpoint-interval', type=int, default=0, help='Iterations between checkpoints (0: none)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--noplot', action='store_true')
    args = parser.parse_args()
    for name in ('batchsize', 'val_batchsize', 'epoch', 'size'):
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
    per_process = max(1, (os.cpu_count() or 1) // comm.intra_size)
    if 'OMP_NUM_THREADS' not in os.environ:
        kusari.set_num_threads(1 if args.gpu else per_process)
    kusari.set_blas_num_threads(per_process)
    loaderjob = args.loaderjob or per_process

    # Every process lists the files (a shared file system); scatter_dataset splits the paths.
    train = open_dataset(args.train, args.root)
    val = open_dataset(args.val, args.root)
    classes = len(train.classes) if hasattr(train, 'classes') else 1000
    if comm.rank == 0:
        print('==========================================')
        print('Num process (COMM_WORLD): {}'.format(comm.size))
        print('Using {} communicator'.format(args.communicator if args.gpu else 'naive'))
        print('Using {} arch, {} classes, {} training images'.format(args.arch, classes, len(train)))
        print('Num Minibatch-size: {}'.format(args.batchsize))
        print('Num epoch: {}'.format(args.epoch))
        print('==========================================', flush=True)
    train = kusari.mn.scatter_dataset(train, comm, shuffle=True, seed=args.seed)         # (multi-node)
    val = kusari.mn.scatter_dataset(val, comm, shuffle=True, seed=args.seed + 1)

    kusari.manual_seed(args.seed)
    model = L.Classifier(getattr(kusari.models, args.arch)(num_classes=classes, dtype=args.dtype,
                                                         channels_last=args.channels_last))
    model.to_device(device)
    # Goyal et al.'s linear scaling: lr for the global batch.
    lr = args.lr * args.batchsize * comm.size / 256
    optimizer = kusari.mn.create_multi_node_optimizer(kusari.optimizers.MomentumSGD(lr=lr, momentum=0.9), comm)
    optimizer.setup(model)
    optimizer.add_hook(kusari.optimizer_hooks.WeightDecay(1e-4, exclude_bias_and_norm=True))
    if args.dtype != 'float32':
        optimizer.use_fp32_update()
        if args.dtype == 'float16':
            optimizer.loss_scaling()

    T = kusari.datasets.transforms
    planar = not args.channels_last
    loader = dict(n_workers=loaderjob, device=device, normalize_on_device=args.gpu, dtype=args.dtype)
    train_iter = kusari.iterators.ImageLoader(
        train, args.batchsize, seed=args.seed + 1000 + comm.rank,
        transform=T.imagenet_train_transform(args.size, planar=planar), **loader)
    val_iter = kusari.iterators.ImageLoader(
        val, args.val_batchsize, repeat=False, shuffle=False,
        transform=T.imagenet_eval_transform(args.size, (args.size * 8 + 6) // 7, planar=planar), **loader)

    # The loaders' examples are rows of one batch array: concat_examples copies it in one piece;
    # channels-last batches (B, H, W, C) are viewed as NCHW.
    def converter(batch, device):
        x, t = kusari.datasets.concat_examples(batch, device)
        if args.channels_last:
            x = kusari.functions.transpose(x, (0, 3, 1, 2)).array
        return x, t

    updater = training.StandardUpdater(train_iter, optimizer, converter=converter, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    schedule = [e for e in (args.epoch * 1 // 3, args.epoch * 2 // 3, args.epoch * 8 // 9) if e > 0]
    trainer.extend(extensions.ExponentialShift('lr', 0.1), trigger=triggers.ManualScheduleTrigger(schedule, 'epoch'))
    evaluator = extensions.Evaluator(val_iter, model, converter=converter, device=device)
    trainer.extend(kusari.mn.create_multi_node_evaluator(evaluator, comm))            # (multi-node)
    if args.checkpoint_interval:
        checkpointer = kusari.mn.create_multi_node_checkpointer('train_imagenet', comm)
        trainer.extend(checkpointer, trigger=(args.checkpoint_interval, 'iteration'))
        checkpointer.maybe_load(trainer, optimizer)
    if comm.rank == 0:
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.observe_lr())
        if not args.noplot:
            trainer.extend(extensions.PlotReport(['main/accuracy', 'validation/main/accuracy'], 'epoch',
                                                 file_name='accuracy.png'))
        trainer.extend(extensions.PrintReport(['epoch', 'iteration', 'main/loss', 'validation/main/loss',
                                               'main/accuracy', 'validation/main/accuracy', 'lr', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar(update_interval=10))
    trainer.run()


if __name__ == '__main__':
    main()
