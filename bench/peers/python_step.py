"""Peer of bench/python_step.cc: one training step of the MLP or the small CNN, the model written
in Python on kusari's package (a Chain whose forward is Python), driven from Python two ways: the
C++ StandardUpdater's update() (the training loop of Trainer.run), and a loop written in Python
(optimizer.update(model, x, t) each step); then, where PyTorch is installed, the same model and
step in PyTorch from Python (eager; with --cuda-graph, captured whole as a CUDA graph). Prints
RESULT lines in milliseconds per step."""
import argparse
import time

import numpy as np

import kusari
import kusari.functions as F
import kusari.links as L
from kusari import training


class MLP(kusari.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(784, 1000)
            self.l2 = L.Linear(1000, 1000)
            self.l3 = L.Linear(1000, 10)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class CNN(kusari.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(1, 32, 3, pad=1)
            self.c2 = L.Convolution2D(32, 64, 3, pad=1)
            self.fc = L.Linear(64 * 7 * 7, 10)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.c1(x)), 2)
        h = F.max_pooling_2d(F.relu(self.c2(h)), 2)
        return self.fc(h)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--model', choices=['mlp', 'cnn'], required=True)
    p.add_argument('--device', default='cpu')
    p.add_argument('--steps', type=int, default=50)
    p.add_argument('--warmup', type=int, default=5)
    p.add_argument('--batch', type=int, default=100)
    p.add_argument('--threads', type=int, default=0)
    p.add_argument('--cuda-graph', action='store_true')
    args = p.parse_args()
    kusari.set_num_threads(1)
    if args.threads:
        kusari.set_blas_num_threads(args.threads)
    kusari.manual_seed(0)
    dev = kusari.Device(args.device)
    n = args.batch * 10
    shape = (n, 784) if args.model == 'mlp' else (n, 1, 28, 28)
    rng = np.random.RandomState(0)
    x = rng.rand(*shape).astype(np.float32)
    t = (np.arange(n) % 10).astype(np.int32)
    model = L.Classifier(MLP() if args.model == 'mlp' else CNN())
    model.to_device(dev)
    opt = kusari.optimizers.Adam()
    opt.setup(model)
    it = kusari.iterators.SerialIterator(kusari.datasets.TupleDataset(x, t), args.batch, shuffle=False)
    updater = training.StandardUpdater(it, opt, device=dev)
    if args.cuda_graph:
        updater.set_use_cuda_graph(True)

    def timed(step):
        for _ in range(args.warmup):
            step()
        dev.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        dev.synchronize()
        return (time.perf_counter() - start) / args.steps * 1e3

    print('RESULT updater_ms', timed(updater.update))
    xs = kusari.asarray(x[:args.batch], device=dev)
    ts = kusari.asarray(t[:args.batch], device=dev)
    print('RESULT python_loop_ms', timed(lambda: opt.update(model, xs, ts)))
    torch_ms = torch_step(args, x[:args.batch], t[:args.batch])
    if torch_ms is not None:
        print('RESULT torch_ms', torch_ms)


def torch_step(args, x, t):
    """The same step in PyTorch (None without it): the models above, Adam, cross entropy."""
    try:
        import torch
    except ImportError:
        return None
    nn = torch.nn
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device('cuda' if args.device.startswith('cuda') else 'cpu')
    if args.model == 'mlp':
        model = nn.Sequential(nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 10))
    else:
        model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(64 * 7 * 7, 10))
    model.to(dev)
    opt = torch.optim.Adam(model.parameters(), capturable=args.cuda_graph)
    xs = torch.from_numpy(x).to(dev)
    ts = torch.from_numpy(t.astype(np.int64)).to(dev)

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(xs), ts).backward()
        opt.step()

    def sync():
        if dev.type == 'cuda':
            torch.cuda.synchronize()

    run = step
    if args.cuda_graph and dev.type == 'cuda':
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    for _ in range(args.warmup):
        run()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        run()
    sync()
    return (time.perf_counter() - start) / args.steps * 1e3


if __name__ == '__main__':
    main()
