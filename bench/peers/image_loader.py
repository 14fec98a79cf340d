"""PyTorch peer of bench_image_loader: DataLoader over torchvision's ImageFolder with the
ImageNet training transforms (PIL), the same files and worker count; prints images per second
over `--batches` batches after the first.

    python3 image_loader.py --dir image_loader_photos --workers 2 --batch 64 --batches 30
"""
import argparse
import time

import torch
import torchvision
from torchvision import transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ds = torchvision.datasets.ImageFolder(args.dir, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True,
                                         num_workers=args.workers, persistent_workers=False)
    it = iter(loader)
    next(it)  # starts the workers
    start = time.perf_counter()
    images = 0
    for _ in range(args.batches):
        x, _ = next(it)
        images += x.shape[0]
    elapsed = time.perf_counter() - start
    print(f"RESULT images_per_second {images / elapsed:.3f}")


if __name__ == "__main__":
    main()
