# SPDX-License-Identifier: Apache-2.0
# Shared by the benchmark scripts that time megamoe-train runs (sourced, not run).
# median: the median of the numbers on stdin, one per line.
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# step_speed OUT: the median step's tokens/s of one run's metrics.jsonl (its first two steps warm
# up).
step_speed() {
  sed -E 's/.*"tokens_per_s":([0-9.e+]+).*/\1/' "$1/metrics.jsonl" | tail -n +3 | median
}
