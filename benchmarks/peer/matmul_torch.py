#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's own BF16 matmul at size^3 (the peer of tile_peak's GEMM).

    /usr/bin/python3 benchmarks/peer/matmul_torch.py [--threads 1,2] [--repeats 5] [--size 2048]

C = A @ B on torch.bfloat16 tensors from N(0, 1) (oneDNN underneath), the threads given to OpenMP
and torch before torch is imported, OMP_WAIT_POLICY=PASSIVE. One JSON line per thread count:
threads, size, gemm_tflops_median over --repeats products after one warm-up.
"""
import argparse
import json
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    if min(counts) < 1 or args.repeats < 1 or args.size < 1:
        print("matmul_torch: counts and size must be positive", file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = str(max(counts))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch  # after the environment: OpenMP reads it once

    n = args.size
    gen = torch.Generator().manual_seed(2024)
    a = torch.randn(n, n, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, n, generator=gen).to(torch.bfloat16)
    for threads in counts:
        torch.set_num_threads(threads)
        a @ b
        seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            a @ b
            seconds.append(time.perf_counter() - t0)
        seconds.sort()
        print(json.dumps({"peer": "pytorch", "threads": threads, "size": n,
                          "gemm_tflops_median": 2.0 * n ** 3 / seconds[len(seconds) // 2] / 1e12}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
