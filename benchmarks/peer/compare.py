#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""megamoe against PyTorch, side by side in one run: the MoE layer, forward + backward.

    /usr/bin/python3 benchmarks/peer/compare.py [--build build] [--shapes A,B,C] [--threads 1,2]
                                                [--runs 3] [--iters 5] [--json out.jsonl]
                                                [--precision fp32|bf16] [--backend NAME]

fp32 (default): megamoe's grouped backend against PyTorch fp32. bf16: megamoe's bf16 recipe on
--backend (default avx512_bf16; amx, or grouped for its fp32 GEMMs) against PyTorch's bf16
autocast; the peak is then the unit's BF16 peak from benchmarks/tile_peak, whose 2048^3 tile GEMM
is also set against PyTorch's own bf16 matmul (peer/matmul_torch.py) each time the peak is taken.

Measures the FP32 FMA peak (benchmarks/peak) before every shape and at the end, taking per thread
count the highest of those medians (a core lent elsewhere for a moment only reads lower: one
start-only measurement here once read 328 GFLOP/s at 2 threads against 463 an hour before, which
put megamoe at 116 % of "peak"). For each shape and thread count it runs
moe_layer_bench and moe_layer_torch.py alternately (the order flips every run), --runs times each,
and prints medians (min-max over the runs) of tokens/s, megamoe's effective GFLOP/s as a fraction of
the peak at that thread count, the ratio megamoe / PyTorch (median of the per-run ratios; each run
PyTorch's better of OMP_WAIT_POLICY=PASSIVE and OpenMP's default, BENCHMARKS.md's peer at its best), B's
GFLOP/s as a fraction of A's, and megamoe's stage shares (router + permute + unpermute).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"compare: {' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines], done.stderr


def spread(values, fmt="{:.0f}"):
    return (fmt + " (" + fmt + "-" + fmt + ")").format(statistics.median(values), min(values),
                                                       max(values))


def overhead_share(shares):
    """Median over runs of router + permute + unpermute, % of the step."""
    if not shares:
        return float("nan")
    return statistics.median(s[0] + s[1] + s[3] for s in shares)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--shapes", default="A,B,C")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", default=None, help="also append every result line here")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--backend", default=None,
                        help="megamoe's expert backend (fp32: grouped; bf16: avx512_bf16)")
    args = parser.parse_args()
    backend = args.backend or ("grouped" if args.precision == "fp32" else "avx512_bf16")
    tile_unit = backend if backend in ("amx", "avx512_bf16") else None
    shapes = args.shapes.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    bench = os.path.join(args.build, "benchmarks", "moe_layer_bench")
    peak_program = os.path.join(args.build, "benchmarks", "peak")
    tile_peak_program = os.path.join(args.build, "benchmarks", "tile_peak")
    torch_script = os.path.join(HERE, "moe_layer_torch.py")
    matmul_script = os.path.join(HERE, "matmul_torch.py")
    kernel_runs = {n: [] for n in threads}  # (megamoe tile GEMM, PyTorch matmul) TFLOP/s
    record = open(args.json, "a") if args.json else None

    peak_runs = {n: [] for n in threads}

    def measure_peak():
        counts = ",".join(map(str, threads))
        if tile_unit is None:
            peaks, _ = run_json([peak_program, "--threads", counts])
            for p in peaks:
                peak_runs[p["threads"]].append(p["gflops_median"])
                if record:
                    record.write(json.dumps(p) + "\n")
            return
        # The unit's BF16 peak and its 2048^3 tile GEMM, then PyTorch's bf16 matmul.
        peaks, _ = run_json([tile_peak_program, "--threads", counts, "--repeats", "3"])
        peaks = [p for p in peaks if p.get("unit") == tile_unit]
        if not peaks or peaks[0].get("available") is False:
            sys.exit(f"compare: the {tile_unit} unit cannot run here: "
                     f"{peaks[0]['reason'] if peaks else 'tile_peak printed nothing for it'}")
        theirs, _ = run_json([sys.executable, matmul_script, "--threads", counts, "--repeats", "3"],
                             dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
        torch_of = {t["threads"]: t["gemm_tflops_median"] for t in theirs}
        for p in peaks:
            peak_runs[p["threads"]].append(1e3 * p["peak_tflops_median"])
            kernel_runs[p["threads"]].append((p["gemm_tflops_median"], torch_of[p["threads"]]))
            if record:
                record.write(json.dumps(p) + "\n")
        if record:
            for t in theirs:
                record.write(json.dumps(t) + "\n")

    results = {}
    for shape in shapes:
        measure_peak()
        for n in threads:
            mine, theirs, ratios, shares = [], [], [], []
            for r in range(args.runs):
                order = ("megamoe", "pytorch") if r % 2 == 0 else ("pytorch", "megamoe")
                got = {}
                for who in order:
                    if who == "megamoe":
                        recipe = ([] if args.precision == "fp32" else
                                  ["--precision", args.precision, "--backend", backend])
                        out, err = run_json([bench, "--shape", shape, "--threads", str(n), "--iters",
                                             str(args.iters)] + recipe)
                        match = re.search(r"router ([0-9.e+-]+)% permute ([0-9.e+-]+)% experts "
                                          r"([0-9.e+-]+)% unpermute ([0-9.e+-]+)%", err)
                        if match:
                            shares.append([float(match.group(i)) for i in range(1, 5)])
                    else:
                        # The peer at its best: the better of OpenMP's passive wait and its
                        # default (spinning), run back to back.
                        tries = []
                        for policy in ("PASSIVE", None):
                            env = dict(os.environ)
                            env.pop("OMP_WAIT_POLICY", None)
                            if policy:
                                env["OMP_WAIT_POLICY"] = policy
                            got_policy, _ = run_json(
                                [sys.executable, torch_script, "--shape", shape, "--threads",
                                 str(n), "--iters", str(args.iters), "--precision",
                                 args.precision, "--omp-wait-policy",
                                 "passive" if policy else "default"], env)
                            tries.append(got_policy[0])
                        out = [max(tries, key=lambda t: t["tokens_per_s"])]
                    got[who] = out[0]
                    if record:
                        record.write(json.dumps(out[0]) + "\n")
                        record.flush()
                mine.append(got["megamoe"])
                theirs.append(got["pytorch"])
                ratios.append(got["megamoe"]["tokens_per_s"] / got["pytorch"]["tokens_per_s"])
            results[(shape, n)] = (mine, theirs, ratios, shares)

    measure_peak()
    peak = {n: max(values) for n, values in peak_runs.items()}
    peak_name = "FP32 FMA" if tile_unit is None else f"BF16 {tile_unit}"
    print(f"megamoe {args.precision} on {backend} against PyTorch {args.precision}")
    print(f"peak {peak_name} GFLOP/s (highest of the medians measured before each shape and at the "
          "end): " + ", ".join(f"{n} thread(s) {peak[n]:.0f} (measured: " +
                               " ".join(f"{v:.0f}" for v in peak_runs[n]) + ")" for n in threads))
    kernels = sorted({m.get("kernel", "?") for mine, _, _, _ in results.values() for m in mine})
    print(f"megamoe expert GEMM kernel: {', '.join(kernels)}")
    if tile_unit is not None:
        print("| threads | megamoe tile GEMM 2048^3 TFLOP/s | % of peak | PyTorch bf16 matmul "
              "TFLOP/s | megamoe / PyTorch |")
        print("|---|---|---|---|---|")
        for n in threads:
            mine_k = [k[0] for k in kernel_runs[n]]
            theirs_k = [k[1] for k in kernel_runs[n]]
            print(f"| {n} | {spread(mine_k, '{:.3f}')} | "
                  f"{100e3 * statistics.median(mine_k) / peak[n]:.0f} | "
                  f"{spread(theirs_k, '{:.3f}')} | "
                  f"{spread([a / b for a, b in kernel_runs[n]], '{:.2f}')} |")
    print("| shape | threads | megamoe tokens/s | megamoe GFLOP/s | % of peak | PyTorch tokens/s "
          "| PyTorch GFLOP/s | megamoe / PyTorch | router+permute+unpermute % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (shape, n), (mine, theirs, ratios, shares) in results.items():
        gflops = statistics.median([m["gflops"] for m in mine])
        print(f"| {shape} | {n} | {spread([m['tokens_per_s'] for m in mine])} | "
              f"{gflops:.0f} | {100 * gflops / peak[n]:.0f} | "
              f"{spread([t['tokens_per_s'] for t in theirs])} | "
              f"{statistics.median([t['gflops'] for t in theirs]):.0f} | "
              f"{spread(ratios, '{:.2f}')} | "
              f"{overhead_share(shares):.1f} |")
    print()
    print("megamoe step split, % of the step (medians over the runs):")
    print("| shape | threads | router | permute | experts (GEMMs + activation) | unpermute |")
    print("|---|---|---|---|---|---|")
    for (shape, n), (_, _, _, shares) in results.items():
        if shares:
            cells = " | ".join(f"{statistics.median(s[i] for s in shares):.2f}" for i in range(4))
            print(f"| {shape} | {n} | {cells} |")
    for n in threads:
        if ("A", n) in results and ("B", n) in results:
            a = statistics.median([m["gflops"] for m in results[("A", n)][0]])
            b = statistics.median([m["gflops"] for m in results[("B", n)][0]])
            print(f"B / A effective GFLOP/s at {n} thread(s): megamoe {b / a:.2f}", end="")
            a = statistics.median([t["gflops"] for t in results[("A", n)][1]])
            b = statistics.median([t["gflops"] for t in results[("B", n)][1]])
            print(f", PyTorch {b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
