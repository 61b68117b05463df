#!/usr/bin/python3
"""PyTorch distributed autograd reference for `axon-bench dist`: the same
rows, measured the same way, with torch.distributed.rpc (TensorPipe).

  /usr/bin/python3 scripts/torch_dist_autograd_bench.py [--steps N]
      [--warmup N] [--edge-iters N] [--rpc-threads N] [--only WHAT]

Four processes on loopback: a master and three workers w1..w3, each with
torch.set_num_threads(1). Each worker holds one stage (an nn.Module created
with rpc.remote, so the master holds RRefs to them). A distributed step:
dist_autograd.context(); stage k runs as rpc.remote on its worker and
fetches stage k-1's output RRef itself (to_here inside the worker: stage
to stage, as axon does); the last stage returns the mean cross-entropy
loss as an RRef; the master fetches it and runs dist_autograd.backward;
DistributedOptimizer(SGD, lr=0.01, momentum=0.9).step(ctx). The context
is released when the `with` block ends. One process: the whole model,
forward, loss, backward, SGD step.

Models: MLP 784/256/128/10 (Linear+ReLU blocks, batch 64, one block per
stage) and ResNet20 (1x32x32 inputs, batch 32, option-B shortcuts; blocks
[stem, b1, b2] [b3..b6] [b7..b9, head] as axon's uniform split of its 11
blocks). Edge overhead: MLP 4/4/4/4 at batch 1 over 3 workers vs one stage
on w1; torch's backward here has one more edge than axon's in both (the
loss fetched to the master), so (3 stages - 1 stage) / 2 is again the cost
per edge. Medians over --steps (and --edge-iters) after --warmup.

Use Debian's python3-torch (/usr/bin/python3), not a pyenv python.
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import DistributedOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_bench import BasicBlock  # noqa: E402  (one ResNet block definition)

NAMES = ["w1", "w2", "w3"]


def resnet20_blocks():
    blocks = [nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False),
                            nn.BatchNorm2d(16), nn.ReLU())]
    cin = 16
    for cout, stride in [(16, 1), (32, 2), (64, 2)]:
        for i in range(3):
            blocks.append(BasicBlock(cin, cout, stride if i == 0 else 1))
            cin = cout
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                nn.Linear(64, 10)))
    return blocks


def mlp_blocks(widths):
    out = []
    for i in range(len(widths) - 1):
        m = [nn.Linear(widths[i], widths[i + 1])]
        if i < len(widths) - 2:
            m.append(nn.ReLU())
        out.append(nn.Sequential(*m))
    return out


def model_blocks(name):
    if name == "mlp":
        return mlp_blocks([784, 256, 128, 10]), [0, 1, 2, 3]
    if name == "tiny":
        return mlp_blocks([4, 4, 4, 4]), [0, 1, 2, 3]
    return resnet20_blocks(), [0, 3, 7, 11]


class Stage(nn.Module):
    def __init__(self, name, k, nstages):
        super().__init__()
        torch.manual_seed(3)
        blocks, b = model_blocks(name)
        if nstages == 1:
            b = [0, len(blocks)]
        self.net = nn.Sequential(*blocks[b[k]:b[k + 1]])

    def forward(self, x, labels):
        if hasattr(x, "to_here"):  # an RRef (PyRRef once received)
            x = x.to_here()
        y = self.net(x)
        return F.cross_entropy(y, labels) if labels is not None else y


def _forward(stage_rref, x, labels):
    return stage_rref.local_value().forward(x, labels)


def _params(stage_rref):
    return [rpc.RRef(p) for p in stage_rref.local_value().parameters()]


def make_stages(name, nstages):
    return [rpc.remote(NAMES[k], Stage, args=(name, k, nstages))
            for k in range(nstages)]


def dist_step(stages, opt, x, labels, timed=None):
    with dist_autograd.context() as ctx:
        y = x
        for k, s in enumerate(stages):
            last = k == len(stages) - 1
            y = rpc.remote(s.owner(), _forward,
                           args=(s, y, labels if last else None))
        loss = y.to_here()
        t0 = time.perf_counter()
        dist_autograd.backward(ctx, [loss])
        if timed is not None:
            timed.append(time.perf_counter() - t0)
        if opt is not None:
            opt.step(ctx)


def batch(name, n):
    g = torch.Generator().manual_seed(12345)
    if name == "resnet20":
        x = torch.randn(n, 1, 32, 32, generator=g)
    else:
        x = torch.randn(n, 784 if name == "mlp" else 4, generator=g)
    return x, torch.randint(0, 10 if name != "tiny" else 4, (n,), generator=g)


def bench_model(name, bs, steps, warmup):
    stages = make_stages(name, 3)
    params = [p for s in stages for p in rpc.rpc_sync(s.owner(), _params, args=(s,))]
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.01, momentum=0.9)
    torch.manual_seed(3)
    local = nn.Sequential(*model_blocks(name)[0])
    lopt = torch.optim.SGD(local.parameters(), lr=0.01, momentum=0.9)
    x, lab = batch(name, bs)
    td, tl = [], []
    for s in range(-warmup, steps):  # alternate: the same load for both
        t0 = time.perf_counter()
        dist_step(stages, opt, x, lab)
        t1 = time.perf_counter()
        lopt.zero_grad()
        F.cross_entropy(local(x), lab).backward()
        lopt.step()
        t2 = time.perf_counter()
        if s >= 0:
            td.append(t1 - t0)
            tl.append(t2 - t1)
    return 1e3 * statistics.median(td), 1e3 * statistics.median(tl)


def bench_edge(iters):
    s3, s1 = make_stages("tiny", 3), make_stages("tiny", 1)
    torch.manual_seed(3)
    local = nn.Sequential(*model_blocks("tiny")[0])
    x, lab = batch("tiny", 1)
    a, c, l = [], [], []
    for i in range(-(iters // 10), iters):
        ta, tc = [], []
        dist_step(s3, None, x, lab, ta)
        dist_step(s1, None, x, lab, tc)
        loss = F.cross_entropy(local(x), lab)
        t0 = time.perf_counter()
        loss.backward()
        tz = time.perf_counter() - t0
        if i >= 0:
            a.append(ta[0])
            c.append(tc[0])
            l.append(tz)
    med = statistics.median
    return 1e6 * med(a), 1e6 * med(c), 1e6 * med(l)


def run(rank, port, args):
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(
        init_method="tcp://127.0.0.1:%d" % port, rpc_timeout=120,
        num_worker_threads=args.rpc_threads)
    name = "master" if rank == 0 else NAMES[rank - 1]
    rpc.init_rpc(name, rank=rank, world_size=4, rpc_backend_options=opts)
    if rank == 0:
        print("# torch %s dist autograd: 3 workers, 1 compute thread per process, "
              "%d TensorPipe worker threads, SGD lr=0.01 momentum=0.9; medians "
              "of %d steps" % (torch.__version__, args.rpc_threads, args.steps))
        if args.only in (None, "mlp"):
            d, l = bench_model("mlp", 64, args.steps, args.warmup)
            print("%-28s %10.2f ms dist  %10.2f ms local  x%.2f"
                  % ("mlp 784/256/128/10 b64", d, l, d / l))
        if args.only in (None, "resnet20"):
            d, l = bench_model("resnet20", 32, args.steps, args.warmup)
            print("%-28s %10.2f ms dist  %10.2f ms local  x%.2f"
                  % ("resnet20 1x32x32 b32", d, l, d / l))
        if args.only in (None, "edge"):
            u3, u1, ul = bench_edge(args.edge_iters)
            print("%-28s %10.1f us 3-stage bwd  %8.1f us 1-stage bwd  %8.1f us "
                  "per edge  (local bwd %.1f us)"
                  % ("edge mlp 4/4/4/4 b1", u3, u1, (u3 - u1) / 2, ul))
        sys.stdout.flush()
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--edge-iters", type=int, default=200)
    p.add_argument("--rpc-threads", type=int, default=4)
    p.add_argument("--only", choices=["mlp", "resnet20", "edge"])
    args = p.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(run, args=(port, args), nprocs=4, join=True)


if __name__ == "__main__":
    main()
