#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""megamoe-train against the same training in PyTorch, side by side in one run.

    /usr/bin/python3 benchmarks/peer/compare_train.py [--build build] [--presets small,fine,medium]
                                                      [--threads 2] [--runs 3] [--steps N]
                                                      [--warmup-steps 3] [--json out.jsonl]

For each preset it runs megamoe-train (one process, --threads pool threads) and
peer/train_torch.py alternately, --runs times each, the order flipping every run; the peer runs
twice per round, with OMP_WAIT_POLICY=PASSIVE and with OpenMP's default, and the better median of
the two is the peer at its best (docs BENCHMARKS.md). Both are timed the same way: tokens per step
over the median step time of the steps after --warmup-steps (megamoe-train's per-step
tokens_per_s in metrics.jsonl: batch to the end of the optimizer update, evaluation excluded).
The FP32 FMA peak at --threads is measured with benchmarks/peak before every preset and at the
end; the highest median counts. Prints per preset: medians (min-max) of megamoe's and the peer's
tokens/s, the ratio (median of the per-round ratios against the peer's better policy), and
megamoe's model GFLOP/s (transformer::flops_per_token, as megamoe-train counts them) as a
fraction of the peak.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = {"tiny": 40, "small": 40, "fine": 40, "medium": 8}


def run(command, env=None):
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"compare_train: {' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def last_json(text):
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def peak(build, threads):
    return last_json(run([os.path.join(build, "benchmarks", "peak"), "--threads", str(threads)]))[
        "gflops_median"]


def megamoe(build, preset, threads, steps, warmup):
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, MEGAMOE_NUM_THREADS=str(threads))
        text = run([os.path.join(build, "examples", "megamoe-train"), "--preset", preset,
                    "--steps", str(steps), "--eval-iters", "1", "--eval-interval", str(steps),
                    "--out", out], env)
        final = last_json(text)["final"]
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    timed = [line["tokens_per_s"] for line in lines[warmup:]]
    per_token = lines[-1]["model_gflops_per_s"] / lines[-1]["tokens_per_s"]
    # tokens per step / median step seconds = the median of the per-step rates.
    return statistics.median(timed), per_token, final["tokens_per_s"]


def peer(preset, threads, steps, warmup, policy):
    text = run(["/usr/bin/python3", os.path.join(HERE, "train_torch.py"), "--preset", preset,
                "--threads", str(threads), "--steps", str(steps), "--warmup-steps", str(warmup),
                "--omp-wait-policy", policy])
    return last_json(text)["tokens_per_s_median"]


def spread(values):
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--presets", default="small,fine,medium")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default per preset)")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--json", help="append one JSON line per preset here")
    args = parser.parse_args()
    peaks = []
    rows = []
    for preset in args.presets.split(","):
        steps = args.steps or STEPS.get(preset, 40)
        warmup = min(args.warmup_steps, steps - 1)
        peaks.append(peak(args.build, args.threads))
        mine, passive, default, ratios = [], [], [], []
        flops_per_token = 0.0
        for r in range(args.runs):
            order = ("megamoe", "peer") if r % 2 == 0 else ("peer", "megamoe")
            for who in order:
                if who == "megamoe":
                    rate, flops_per_token, _ = megamoe(args.build, preset, args.threads, steps,
                                                       warmup)
                    mine.append(rate)
                else:
                    passive.append(peer(preset, args.threads, steps, warmup, "passive"))
                    default.append(peer(preset, args.threads, steps, warmup, "default"))
            ratios.append(mine[-1] / max(passive[-1], default[-1]))
            print(f"{preset} run {r + 1}: megamoe {mine[-1]:.0f}, peer passive {passive[-1]:.0f}, "
                  f"default {default[-1]:.0f} tokens/s", file=sys.stderr)
        best = passive if statistics.median(passive) >= statistics.median(default) else default
        rows.append({"preset": preset, "threads": args.threads, "runs": args.runs, "steps": steps,
                     "megamoe_tokens_per_s": statistics.median(mine),
                     "megamoe_runs": mine, "peer_passive_runs": passive,
                     "peer_default_runs": default,
                     "peer_best_policy": "passive" if best is passive else "default",
                     "ratio": statistics.median(ratios),
                     "megamoe_gflops": statistics.median(mine) * flops_per_token})
    peaks.append(peak(args.build, args.threads))
    top = max(peaks)
    print(f"FP32 FMA peak at {args.threads} threads: {top:.0f} GFLOP/s (highest of "
          f"{len(peaks)} medians: {', '.join(f'{p:.0f}' for p in peaks)})")
    print("| preset | megamoe tokens/s | PyTorch passive | PyTorch default | megamoe / PyTorch at "
          "its best | megamoe model GFLOP/s | of peak |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        row["peak_gflops"] = top
        row["of_peak"] = row["megamoe_gflops"] / top
        print(f"| {row['preset']} | {spread(row['megamoe_runs'])} | "
              f"{spread(row['peer_passive_runs'])} | {spread(row['peer_default_runs'])} | "
              f"{row['ratio']:.2f}x | {row['megamoe_gflops']:.0f} | {100 * row['of_peak']:.0f} % |")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
