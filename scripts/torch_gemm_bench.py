#!/usr/bin/env python3
"""PyTorch reference for `axon-bench gemm`: one N x N x N f32 matrix product
(torch.mm on random data), FP32 or TF32, timed the same way (warm-up, then
--repeat loops of --iters products between two device synchronisations; the
median loop's mean time per product). Prints one line in the same format as
axon-bench gemm.

  python3 scripts/torch_gemm_bench.py --device cuda --size 4096
  python3 scripts/torch_gemm_bench.py --device cuda --size 4096 --tf32
"""
import argparse
import statistics
import time

import torch


def set_tf32(on):
    """TF32 for cuBLAS matmuls (and cuDNN convolutions) on or off. PyTorch
    >= 2.9 has per-backend fp32_precision settings and refuses to mix them
    with the legacy allow_tf32 flags, so the new API is used when present."""
    matmul = torch.backends.cuda.matmul
    try:  # PyTorch < 2.9 raises AttributeError or (1.x) AssertionError
        new_api = matmul.fp32_precision is not None
    except (AttributeError, AssertionError):
        new_api = False
    if new_api:
        mode = "tf32" if on else "ieee"
        matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
        return "fp32_precision=" + mode
    matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return f"allow_tf32={on}"


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=0,
                    help="products per timed loop (default 20 on CUDA, 3 on the CPU)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tf32", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    iters = a.iters or (20 if dev.type == "cuda" else 3)
    mode = set_tf32(a.tf32)
    n = a.size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=g).to(dev)
    y = torch.randn(n, n, generator=g).to(dev)
    out = torch.full((n, n), float("nan"), device=dev)
    for _ in range(3):
        torch.mm(x, y, out=out)
    sync(dev)
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(x, y, out=out)
        sync(dev)
        times.append((time.perf_counter() - t0) / iters)
    sec = statistics.median(times)
    # 64 entries against float64 dot products, relative to sum |x_ik y_kj|.
    idx = torch.randint(0, n, (2, 64), generator=g)
    xs, ys = x.double().cpu(), y.double().cpu()
    prod = xs[idx[0]] * ys[:, idx[1]].T
    ref, mag = prod.sum(1), prod.abs().sum(1)
    got = out.cpu()[idx[0], idx[1]].double()
    err = ((got - ref).abs() / mag).max().item()
    tflops = 2.0 * n ** 3 / sec / 1e12
    print(f"torch gemm: device={a.device} n={n} iters={iters} repeat={a.repeat} "
          f"tf32={int(a.tf32)} ({mode}) threads={torch.get_num_threads()} "
          f"ms={1e3 * sec:.3f} tflops={tflops:.2f} max_err={err:.2e}")


if __name__ == "__main__":
    main()
