"""Markdown tables of benches/clients/run.sh's cells (one JSON line each, with
its round): medians of the rounds, and ratios to the pgque Python worker's
figure of the same round (the median of the per-round ratios).

    report.py RAW.jsonl N ROUNDS START_LOAD END_LOAD SECONDS
"""

import json
import statistics
import sys

REF = "pgque Worker (Python)"


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def fmt(x, d=0):
    if x is None:
        return "-"
    return f"{x:,.{d}f}"


def main() -> None:
    raw, n, rounds, load0, load1, secs = sys.argv[1:7]
    cells = [json.loads(line) for line in open(raw) if line.strip()]
    print(f"N = {n} jobs per drain cell, {rounds} interleaved rounds, medians of the rounds; "
          f"load average (1, 5, 15 min) at start {load0}, at end {load1}; {int(secs) // 60} min {int(secs) % 60} s\n")

    # ---- drain
    drain: dict = {}
    for c in cells:
        if c["cell"].get("mode", "drain") == "drain":
            drain.setdefault(c["cell"]["system"], {})[c["round"]] = c["cell"]
    if drain:
        print("### Drain: jobs/s\n")
        print("| system | jobs per cell | jobs/s (median) | rounds | vs pgque Python worker (per round) |")
        print("|---|---|---|---|---|")
        ref = drain.get(REF, {})
        for s, by in drain.items():
            rs = sorted(by)
            vals = [by[r]["jobs_per_s"] for r in rs]
            ratios = [by[r]["jobs_per_s"] / ref[r]["jobs_per_s"] for r in rs if r in ref]
            print(f"| {s} | {by[rs[0]]['jobs']:,} | {fmt(med(vals))} | {', '.join(fmt(v) for v in vals)} | "
                  f"{med(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}) |")
        print()

    # ---- rate
    rate: dict = {}
    for c in cells:
        if c["cell"].get("mode") == "rate":
            k = (float(c["cell"]["target"]), c["cell"]["system"])
            rate.setdefault(k, {})[c["round"]] = c["cell"]
    if rate:
        print("### Fixed rate: enqueue -> handler start latency (ms)\n")
        print("| target jobs/s | system | achieved jobs/s | received / sent | p50 ms | p99 ms | p50 vs pgque Py | p99 vs pgque Py | enqueue call p50 ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (t, s), by in sorted(rate.items(), key=lambda kv: kv[0][0]):
            rs = sorted(by)
            ref = rate.get((t, REF), {})
            p50 = [by[r]["p50_ms"] for r in rs]
            p99 = [by[r]["p99_ms"] for r in rs]
            r50 = [by[r]["p50_ms"] / ref[r]["p50_ms"] for r in rs if r in ref and by[r]["p50_ms"] and ref[r]["p50_ms"]]
            r99 = [by[r]["p99_ms"] / ref[r]["p99_ms"] for r in rs if r in ref and by[r]["p99_ms"] and ref[r]["p99_ms"]]
            got = sum(by[r]["received"] for r in rs)
            sent = sum(by[r]["sent"] for r in rs)
            print(f"| {fmt(t)} | {s} | {fmt(med([by[r]['achieved'] for r in rs]))} | {got:,} / {sent:,} | "
                  f"{fmt(med(p50), 1)} ({', '.join(fmt(x, 1) for x in p50)}) | {fmt(med(p99), 1)} ({', '.join(fmt(x, 1) for x in p99)}) | "
                  f"{(f'{med(r50):.2f}x' if r50 else '-')} | {(f'{med(r99):.2f}x' if r99 else '-')} | "
                  f"{fmt(med([by[r]['enqueue_ms_p50'] for r in rs]), 2)} |")
        print()

    # ---- exactly-once
    eo: dict = {}
    for c in cells:
        if c["cell"].get("mode") == "eo":
            eo.setdefault(c["cell"]["system"], {}).setdefault(c["cell"]["handler"], {})[c["round"]] = c["cell"]["jobs_per_s"]
    if eo:
        print("### Exactly-once cost: jobs/s of a drain\n")
        print("| worker | no-op handler | plain handler + insert (own connection) | exactly-once handler + insert (job's tx) | exactly-once / plain (per round) | exactly-once / no-op |")
        print("|---|---|---|---|---|---|")
        for s, hs in eo.items():
            def m(h):
                return med(list(hs.get(h, {}).values()))

            rs = sorted(set(hs.get("tx", {})) & set(hs.get("plain", {})))
            ratios = [hs["tx"][r] / hs["plain"][r] for r in rs]
            rs0 = sorted(set(hs.get("tx", {})) & set(hs.get("noop", {})))
            r0 = [hs["tx"][r] / hs["noop"][r] for r in rs0]
            print(f"| {s} | {fmt(m('noop'))} | {fmt(m('plain'))} | {fmt(m('tx'))} | "
                  f"{(f'{med(ratios):.2f}x' if ratios else '-')} ({', '.join(f'{x:.2f}' for x in ratios)}) | "
                  f"{(f'{med(r0):.2f}x' if r0 else '-')} |")
        print()


if __name__ == "__main__":
    main()
