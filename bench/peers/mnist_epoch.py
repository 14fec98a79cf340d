"""PyTorch peer of bench/mnist_epoch.cc: one epoch of the MNIST MLP with Adam, batch 100, on
the Fashion-MNIST training set (read from the same IDX files), computing loss and accuracy per
batch like kusari's Classifier."""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iterations", type=int, default=600)
    p.add_argument("--data", default=os.path.join(os.environ.get("KUSARI_DATASET_ROOT", "/usr/share/datasets"),
                                                  "fashion-mnist"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.from_numpy(load_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz")).reshape(-1, 784)
                         .astype(np.float32) / 255.0)
    t = torch.from_numpy(load_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(784, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000),
                                torch.nn.ReLU(), torch.nn.Linear(1000, 10))
    opt = torch.optim.Adam(model.parameters())
    order = torch.randperm(x.shape[0])

    def step(i):
        idx = order[(i * 100) % x.shape[0]:(i * 100) % x.shape[0] + 100]
        xb, tb = x[idx], t[idx]
        y = model(xb)
        loss = F.cross_entropy(y, tb)
        (y.argmax(1) == tb).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(5):
        step(i)
    start = time.perf_counter()
    for i in range(args.iterations):
        step(i)
    elapsed = time.perf_counter() - start
    print("RESULT seconds_per_epoch", elapsed * 600.0 / args.iterations)


if __name__ == "__main__":
    main()
