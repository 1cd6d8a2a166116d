#!/usr/bin/env python3
"""bench/tls's summary: the `engine` scenario's rows of each round, plain
beside TLS, and the TLS / plain ratios. A cost or a rate is judged on the
median round; a tail (p99) on the worst round of each side.

Usage: tls-summary.py OUT_DIR ROUNDS EXTRA_FLAGS [OUT_DIR_AS_GIVEN]
"""
import json
import statistics
import sys

out, rounds, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3]
shown = sys.argv[4] if len(sys.argv) > 4 else out
rows = {}  # (mode, strategy) -> [result per round]
for mode in ("plain", "tls"):
    for r in range(1, rounds + 1):
        with open(f"{out}/{mode}-{r}/results.json") as f:
            for res in json.load(f)["results"]:
                rows.setdefault((mode, res["strategy"]), []).append(res)


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


print("# What TLS costs on the hot path")
print()
print(f"Command: `bench/tls {shown} {rounds}{' ' + extra if extra else ''}`")
print()
print("Two scratch clusters of 3 masters (no replicas, appendonly yes), one plain "
      "and one TLS-only (tls-cluster yes, RSA 2048 certificate), "
      "flashsale-bench `--scenarios engine` on each, the two alternating per round. "
      "Per round: its own row; errors and oversold units must be 0.")
print()
print("| round | cluster | strategy | confirmed/s | master µs/confirmed | client µs/confirmed "
      "| p50 ms | p99 ms | errors | oversold |")
print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
bad = 0
for strategy in ("engine", "engine@10%"):
    for r in range(rounds):
        for mode in ("plain", "tls"):
            res = rows[(mode, strategy)][r]
            bad += res["errors"] + res["oversold"]
            print(f"| {r + 1} | {mode} | {strategy} | {res['throughput']:.0f} "
                  f"| {fmt(res['master_us_per_confirmed'])} "
                  f"| {fmt(res['client_us_per_confirmed'])} "
                  f"| {res['p50_ms']:.3f} | {res['p99_ms']:.3f} "
                  f"| {res['errors']} | {res['oversold']} |")
print()


def med(mode, strategy, key):
    vals = [x[key] for x in rows[(mode, strategy)] if x[key] is not None]
    return statistics.median(vals) if vals else None


def worst(mode, strategy, key):
    vals = [x[key] for x in rows[(mode, strategy)] if x[key] is not None]
    return max(vals) if vals else None


print("| figure | plain | TLS | TLS / plain |")
print("| --- | ---: | ---: | ---: |")
for label, strategy, key, pick in (
    ("master CPU µs per confirmed purchase (engine, median round)", "engine",
     "master_us_per_confirmed", med),
    ("engine process CPU µs per confirmed purchase (engine, median round)", "engine",
     "client_us_per_confirmed", med),
    ("confirmed purchases/s (engine, median round)", "engine", "throughput", med),
    ("p50 ms at 10 % of its own peak (engine@10%, median round)", "engine@10%", "p50_ms", med),
    ("p99 ms at 10 % of its own peak (engine@10%, worst round)", "engine@10%", "p99_ms", worst),
):
    p, t = pick("plain", strategy, key), pick("tls", strategy, key)
    ratio = "-" if not p or t is None else f"{t / p:.2f}"
    print(f"| {label} | {fmt(p, 3 if 'ms' in label else 1)} | {fmt(t, 3 if 'ms' in label else 1)} | {ratio} |")
print()
if bad:
    print(f"**{bad} errors or oversold units in these rows: the figures above do not count.**")
else:
    print("Every row: 0 errors, 0 oversold.")
