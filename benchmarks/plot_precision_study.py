#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws benchmarks/precision_study.sh's picture (plain SVG) and prints its markdown table.

   plot_precision_study.py WORKDIR OUT_SVG

WORKDIR holds one folder per recipe with megamoe-train's metrics.jsonl and final.json."""
import json
import pathlib
import sys

# nvfp4 keeps its first and last layers in BF16 (megamoe-train's default, as the reference's
# NVFP4 recipes); nvfp4_every_layer runs every layer in NVFP4.
RECIPES = ["fp32", "bf16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8", "nvfp4",
           "nvfp4_every_layer"]
COLOURS = ["#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
           "#e377c2"]
# The targets of the study: relative distance from fp32's final held-out bits per byte.
TARGETS = {"bf16": 0.01, "nvfp4": 0.10, "nvfp4_every_layer": 0.10}
FP8_TARGET = 0.03


def load(work):
    runs = {}
    for recipe in RECIPES:
        folder = work / recipe
        if not (folder / "final.json").exists():
            continue
        lines = [json.loads(l) for l in (folder / "metrics.jsonl").read_text().splitlines() if l]
        final = json.loads((folder / "final.json").read_text())["final"]
        speeds = sorted(l["tokens_per_s"] for l in lines[len(lines) // 10:])
        runs[recipe] = {
            "train": [(l["step"], l["train_bpb"]) for l in lines],
            # The median step: robust to a step slowed by something else on the machine.
            "tokens_per_s": speeds[len(speeds) // 2],
            "heldout": [(l["step"], l["heldout_bpb"]) for l in lines if "heldout_bpb" in l],
            "final": final,
        }
    return runs


def smooth(points, width=20):
    out = []
    for i in range(len(points)):
        window = points[max(0, i - width + 1): i + 1]
        out.append((points[i][0], sum(v for _, v in window) / len(window)))
    return out


def panel(x0, y0, w, h, title, series, y_range, steps):
    lo, hi = y_range
    parts = [f'<g transform="translate({x0},{y0})">',
             f'<rect width="{w}" height="{h}" fill="none" stroke="#888"/>',
             f'<text x="{w / 2}" y="-8" text-anchor="middle" font-size="13">{title}</text>']
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        y = h - h * k / 5
        parts.append(f'<line x1="0" x2="{w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="-6" y="{y + 4:.1f}" text-anchor="end" font-size="10">{v:.2f}</text>')
    for k in range(0, 8):
        s = steps * k / 7
        x = w * k / 7
        parts.append(f'<text x="{x:.1f}" y="{h + 14}" text-anchor="middle" font-size="10">{s:.0f}</text>')
    parts.append(f'<text x="{w / 2}" y="{h + 30}" text-anchor="middle" font-size="11">step</text>')
    for (recipe, points), colour in series:
        if not points:
            continue
        path = " ".join(
            f"{w * s / steps:.1f},{h - h * (min(max(v, lo), hi) - lo) / (hi - lo):.1f}"
            for s, v in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    parts.append("</g>")
    return "\n".join(parts)


def main():
    work, svg = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    runs = load(work)
    steps = max(p[-1][0] for r in runs.values() for p in [r["train"]])
    heldout = [(recipe, runs[recipe]["heldout"]) for recipe in runs]
    train = [(recipe, smooth(runs[recipe]["train"])) for recipe in runs]
    colours = [COLOURS[RECIPES.index(r)] for r in runs]
    # The axes cover the steps after the first seventh, where the recipes part (earlier values
    # are clipped at the top).
    h_values = [v for _, p in heldout for s, v in p if s >= steps / 7]
    t_values = [v for _, p in train for s, v in p if s >= steps / 7]
    w, h = 420, 300
    legend = []
    for i, recipe in enumerate(runs):
        y = 40 + 16 * i
        legend.append(f'<line x1="950" x2="975" y1="{y}" y2="{y}" stroke="{colours[i]}" stroke-width="2"/>'
                      f'<text x="980" y="{y + 4}" font-size="11">{recipe}</text>')
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="1060" height="380" font-family="sans-serif">',
        '<rect width="100%" height="100%" fill="white"/>',
        panel(60, 30, w, h, "held-out bits per byte", list(zip(heldout, colours)),
              (min(h_values) - 0.05, max(h_values) + 0.05), steps),
        panel(530, 30, w, h, f"training bits per byte (mean of 20 steps)", list(zip(train, colours)),
              (min(t_values) - 0.05, max(t_values) + 0.05), steps),
        *legend, "</svg>"]
    svg.parent.mkdir(parents=True, exist_ok=True)
    svg.write_text("\n".join(body) + "\n")
    fp32 = runs["fp32"]["final"]["heldout_bpb"] if "fp32" in runs else None
    print("| recipe | final held-out bpb | vs fp32 | target | tokens/s (median step) |")
    print("|---|---|---|---|---|")
    for recipe, run in runs.items():
        f = run["final"]
        diff = "" if fp32 is None or recipe == "fp32" else f"{100 * (f['heldout_bpb'] / fp32 - 1):+.2f} %"
        target = "" if recipe == "fp32" else f"within {100 * TARGETS.get(recipe, FP8_TARGET):.0f} %"
        print(f"| {recipe} | {f['heldout_bpb']:.4f} | {diff} | {target} | {run['tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
