#!/usr/bin/python3
"""PyTorch RPC (TensorPipe) reference for `axon-bench rpc`: the same rows,
measured the same way, between two processes on loopback.

  /usr/bin/python3 scripts/torch_rpc_bench.py [--iters N] [--reps N]
      [--transport default|uv] [--axon-bench build/axon-bench]

Rows (as agents/axon_bench_rpc.c measures them):
  small call p50/p99   rpc_sync of a trivial function (returns its int
                       argument); 100 warm-up calls, then --iters calls
  calls/s, 64 in flight  4 * iters rpc_async calls kept 64 deep: a ring of
                       64 futures, waiting on the oldest before reusing it
  1/16/64 MiB tensor   rpc_sync sending one f32 tensor to a function that
                       returns its byte count; best of --reps; GB/s = bytes
                       over the round trip (one-way payload)

--transport uv restricts TensorPipe to its TCP transport and basic channel
(the same loopback TCP path axon uses); the default lets TensorPipe pick
(shared memory and cross-memory-attach between processes on one host).
With --axon-bench, the axon benchmark runs right after, in the same
invocation, and the ratios axon / torch are printed side by side.

Use Debian's python3-torch (/usr/bin/python3), not a pyenv python.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

SIZES = [1 << 20, 16 << 20, 64 << 20]
ROWS = ["small call p50 (us)", "small call p99 (us)", "calls/s, 64 in flight",
        "1 MiB tensor (GB/s)", "16 MiB tensor (GB/s)", "64 MiB tensor (GB/s)"]


def ping(x):
    return x


def sink(t):
    return t.numel() * t.element_size()


def options(port, transport):
    kw = dict(init_method="tcp://127.0.0.1:%d" % port, rpc_timeout=60)
    if transport == "uv":
        kw["_transports"] = ["uv"]
        kw["_channels"] = ["basic"]
    return rpc.TensorPipeRpcBackendOptions(**kw)


def bench(iters, reps):
    args = (7,)
    lat = []
    for i in range(iters + 100):
        t0 = time.perf_counter()
        rpc.rpc_sync("server", ping, args=args)
        if i >= 100:
            lat.append(time.perf_counter() - t0)
    lat.sort()
    out = [lat[iters // 2] * 1e6, lat[iters * 99 // 100] * 1e6]
    total = iters * 4
    ring = [None] * 64
    t0 = time.perf_counter()
    for i in range(total + 64):
        slot = i % 64
        if i >= 64:
            ring[slot].wait()
        if i < total:
            ring[slot] = rpc.rpc_async("server", ping, args=args)
    out.append(total / (time.perf_counter() - t0))
    for size in SIZES:
        t = torch.ones(size // 4, dtype=torch.float32)
        best = 1e9
        for _ in range(reps):
            t1 = time.perf_counter()
            n = rpc.rpc_sync("server", sink, args=(t,))
            t1 = time.perf_counter() - t1
            assert n == size
            best = min(best, t1)
        out.append(size / best / 1e9)
    return out


def worker(rank, port, transport, iters, reps, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    name = "client" if rank == 0 else "server"
    rpc.init_rpc(name, rank=rank, world_size=2,
                 rpc_backend_options=options(port, transport))
    if rank == 0:
        q.put(bench(iters, reps))
    rpc.shutdown()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_torch(iters, reps, transport):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker,
                         args=(r, port, transport, iters, reps, q))
             for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=600)
    for p in procs:
        p.join()
    return res


def run_axon(path, iters, reps):
    out = subprocess.run([path, "rpc", "--iters", str(iters), "--reps",
                          str(reps)], check=True, capture_output=True,
                         text=True).stdout
    raw, ax = [], []
    for line in out.splitlines():
        for row in ROWS:
            if line.startswith(row):
                f = line[len(row):].split()
                raw.append(float(f[0]))
                ax.append(float(f[1]))
    return raw, ax


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--transport", choices=["default", "uv"],
                    default="default")
    ap.add_argument("--axon-bench", help="also run this axon-bench binary")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tr = run_torch(a.iters, a.reps, a.transport)
    title = "torch rpc (%s)" % a.transport
    if not a.axon_bench:
        print("%-28s %12s" % (title, "torch RPC"))
        for row, v in zip(ROWS, tr):
            print("%-28s %12.2f" % (row, v))
        return
    raw, ax = run_axon(a.axon_bench, a.iters, a.reps)
    print("%-28s %12s %12s %12s %10s" % (title, "raw TCP", "axon RPC",
                                         "torch RPC", "axon/torch"))
    for row, r, x, t in zip(ROWS, raw, ax, tr):
        print("%-28s %12.2f %12.2f %12.2f %10.2f" % (row, r, x, t, x / t))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
