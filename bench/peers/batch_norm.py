"""PyTorch peer of bench/batch_norm.cc: training-mode F.batch_norm, forward and backward, over the
53 batch norms of a ResNet-50 at the same batch and input size, with the same dtype and layout
(16-bit input, float32 weight and statistics). Timed with cuDNN allowed (PyTorch's default) and
with torch.backends.cudnn.enabled = False (PyTorch's own kernels); the relu rows add the
shortcut and apply F.relu after the batch norm, as a residual block does."""
import argparse
import time

import torch
import torch.nn.functional as F


def resnet50_batch_norms(size):
    layers = []
    hw = size // 2
    layers.append((64, hw))
    hw //= 2
    width = 64
    for stage, blocks in enumerate([3, 4, 6, 3]):
        for b in range(blocks):
            first = b == 0
            out_hw = hw // 2 if first and stage > 0 else hw
            layers += [(width, hw), (width, out_hw), (width * 4, out_hw)]
            if first:
                layers.append((width * 4, out_hw))
            hw = out_hw
        width *= 2
    return layers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--layout", default="nchw")
    args = p.parse_args()
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    fmt = torch.channels_last if args.layout == "cl" else torch.contiguous_format
    layers = resnet50_batch_norms(args.size)
    inputs = {}
    for c, hw in layers:
        if (c, hw) not in inputs:
            shape = (args.batch, c, hw, hw)
            make = lambda lo, hi: (torch.rand(shape, device=dev) * (hi - lo) + lo).to(dtype).contiguous(
                memory_format=fmt)
            inputs[(c, hw)] = (make(-2, 3), make(-1, 1), make(-1, 1))
    params = [(torch.ones(c, device=dev, requires_grad=True), torch.zeros(c, device=dev, requires_grad=True),
               torch.zeros(c, device=dev), torch.ones(c, device=dev)) for c, _ in layers]

    def run(relu):
        for (c, hw), (w, b, rm, rv) in zip(layers, params):
            x0, r, gy = inputs[(c, hw)]
            x = x0.detach().requires_grad_()
            y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
            if relu:
                y = F.relu(y + r)
            y.backward(gy)
            w.grad = None
            b.grad = None

    def timed(relu):
        for _ in range(3):
            run(relu)
        sync()
        start = time.perf_counter()
        for _ in range(args.repeats):
            run(relu)
        sync()
        return (time.perf_counter() - start) / args.repeats * 1e3

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print("RESULT bn_ms", timed(False))
    print("RESULT bn_add_relu_ms", timed(True))
    if dev.type == "cuda":
        torch.backends.cudnn.enabled = False
        print("RESULT bn_ms_nocudnn", timed(False))
        print("RESULT bn_add_relu_ms_nocudnn", timed(True))


if __name__ == "__main__":
    main()
