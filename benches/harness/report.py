"""Write the results file (markdown): machine, settings, command, every cell's
figures, medians, per-round ratios of each pgque system to each reference, and a
summary of the issue's targets computed from the same figures."""
from .core import fmt, median


def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def _dead_total(m):
    d = m.get("dead") if m else None
    return sum(d.values()) if isinstance(d, dict) else None


def workload_md(w):
    out = [f"### {w.wid}: {w.title}", ""]
    if w.about:
        out += [w.about, ""]
    for s in w.skipped:
        out.append(f"- **skipped**: {s}")
    if w.skipped:
        out.append("")
    if w.seconds is not None:
        out += [f"(wall time of this workload: {w.seconds:.0f} s)", ""]
    prim, plabel = w.metrics[0]
    for v in w.variants():
        systems = w.systems(v)
        rounds = w.rounds(v)
        out.append(f"**{v}** — {plabel}")
        out.append("")
        hdr = ["system"] + [f"round {r}" for r in rounds] + ["median"] + [f"{lab} (median)" for _, lab in w.metrics[1:]] + ["dead tuples at end (median)"]
        out.append("| " + " | ".join(hdr) + " |")
        out.append("|" + "---|" * len(hdr))
        for s in systems:
            row = [s] + [fmt(w.value(v, s, r, prim)) for r in rounds] + [fmt(w.med(v, s, prim))]
            row += [fmt(w.med(v, s, k)) for k, _ in w.metrics[1:]]
            dts = [_dead_total(m) for vv, ss, rr, m in w.cells if vv == v and ss == s]
            row.append(fmt(median(dts)))
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        mine = [s for s in systems if s.startswith("pgque")]
        # w8's floor is a yardstick for the loop, not a queue to beat
        refs = [s for s in systems if not s.startswith("pgque") and s != "floor"]
        if mine and refs:
            out.append(f"ratio of {plabel} per round ({'higher' if w.higher_is_better else 'lower'} is better for pgque)")
            out.append("")
            hdr = ["pgque system / reference"] + [f"round {r}" for r in rounds] + ["median of rounds", "ratio of medians"]
            out.append("| " + " | ".join(hdr) + " |")
            out.append("|" + "---|" * len(hdr))
            for a in mine:
                for b in refs:
                    rs = [_ratio(w.value(v, a, r, prim), w.value(v, b, r, prim)) for r in rounds]
                    out.append("| " + " | ".join([f"{a} / {b}"] + [fmt(x) for x in rs] + [fmt(median(rs)), fmt(_ratio(w.med(v, a, prim), w.med(v, b, prim)))]) + " |")
            out.append("")
        # dead tuples per table, last round
        details = []
        for s in systems:
            d = w.last(v, s, "dead")
            if isinstance(d, dict):
                nz = {t: n for t, n in d.items() if n}
                details.append(f"{s}: " + (", ".join(f"{t} {n:,}" for t, n in sorted(nz.items(), key=lambda kv: -kv[1])) if nz else "0 in every table"))
        if details:
            out.append("dead tuples per table at the end of the last round: " + "; ".join(details))
            out.append("")
    for title, header, rows in w.extra_tables:
        out += [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            out.append("| " + " | ".join(fmt(x) if not isinstance(x, str) else x for x in r) + " |")
        out.append("")
    last = {}
    for v, s, r, rows in w.profiles:
        last[(v, s)] = (r, rows)
    if last:
        out += ["<details><summary>profile: the statements that took the most time in the pgque cells "
                "(pg_stat_statements, last round of each)</summary>", ""]
        for (v, s), (r, rows) in last.items():
            out += [f"{v} | {s} | round {r}", "",
                    "| level | calls | total ms | mean ms | rows/call | buffers/call | statement |", "|---|---|---|---|---|---|---|"]
            for top, calls, total, nrows, bufs, q in rows:
                q = q.replace("|", "\\|")
                out.append(f"| {'top' if top else 'nested'} | {calls:,} | {total:.0f} | {total / max(calls, 1):.3f} | "
                           f"{nrows / max(calls, 1):.1f} | {bufs:.1f} | `{q}` |")
            out.append("")
        out += ["</details>", ""]
    for n in w.notes:
        out.append(f"- note: {n}")
    if w.notes:
        out.append("")
    return out


def targets(res):
    """(target, measured, met) lines from the issue, computed from the figures of this run."""
    W = {w.wid: w for w in res.workloads}
    rows = []

    def add(name, val, ok, how):
        rows.append((name, val, ok, how))

    def ratio_of_medians(wid, v, a, b, key="rate"):
        w = W.get(wid)
        if not w:
            return None
        return _ratio(w.med(v, a, key), w.med(v, b, key))

    def skipped(wid):
        w = W.get(wid)
        if not w:
            return "workload not run"
        return "; ".join(w.skipped) or "no figure"

    r = ratio_of_medians("w1", "batch=1", "pgque", "pgq")
    add("w1 send ≥ 1.0x PgQ insert_event", r, None if r is None else r >= 1.0, skipped("w1") if r is None else "median pgque / median pgq")
    r = ratio_of_medians("w1", "batch=1", "pgque_text", "pgq")
    if r is not None:
        add("w1 send, text payload, ≥ 1.0x PgQ insert_event", r, r >= 1.0, "median pgque_text / median pgq")
    r = ratio_of_medians("w2", "batch=100", "pgque", "plain")
    add("w2 batch send 100 ≥ 0.8x plain INSERT", r, None if r is None else r >= 0.8, skipped("w2") if r is None else "median pgque / median plain")
    for v in ("batch=100", "batch=500"):
        r = ratio_of_medians("w3", v, "pgque", "pgq")
        add(f"w3 drain {v} ≥ 1.0x PgQ", r, None if r is None else r >= 1.0, skipped("w3") if r is None else "median pgque / median pgq")
    for wid, v in (("w1", "batch=1"), ("w2", "batch=100")):
        r = ratio_of_medians(wid, v, "pgque", "plain", "wal_per")
        add(f"{wid} {v} WAL/event ≤ 1.05x plain INSERT", r, None if r is None else r <= 1.05, skipped(wid) if r is None else "median WAL B/event pgque / plain")
    w = W.get("w4")
    p50 = w.med("rate=500/s", "pgque (worker)", "p50") if w else None
    p99 = w.med("rate=500/s", "pgque (worker)", "p99") if w else None
    add("w4 latency at 500/s: p50 ≤ 10 ms", p50, None if p50 is None else p50 <= 10, skipped("w4") if p50 is None else "median of rounds, ms")
    add("w4 latency at 500/s: p99 ≤ 50 ms", p99, None if p99 is None else p99 <= 50, skipped("w4") if p99 is None else "median of rounds, ms")
    w = W.get("w10")
    for v in (w.variants() if w else []):
        r = ratio_of_medians("w10", v, "pgque (one interval)", "ref: pgque many ticks")
        add(f"w10 one-interval drain {v} at batch 500 ≤ 1.5x the many-ticks drain", r, None if r is None else r >= 1 / 1.5,
            skipped("w10") if r is None else "median rate one interval / many ticks (≥ 0.67)")
    r = ratio_of_medians("w6", "batch=100 producers=1", "pgque", "plain")
    add("w6 enqueue_ready_rows at 100 ≥ 0.5x plain INSERT", r, None if r is None else r >= 0.5, skipped("w6") if r is None else "median pgque / plain, 1 producer")
    w = W.get("w6")
    s = w.med("batch=100 producers=1", "pgque", "stmts") if w else None
    add("w6 one statement per call (client: 1 by construction; nested statements/call ≤ 1)", s, None if s is None else s <= 1.0001,
        skipped("w6") if s is None else "pg_stat_statements track=all: nested statements per call")
    w = W.get("w7")
    if w and w.extra_tables and any(r[0].startswith("pgque") for r in w.extra_tables[0][2]):
        for row in w.extra_tables[0][2]:
            if row[0].startswith("pgque"):
                x = row[-1]
                add(f"w7 dispatch p50 deepest/shallowest ≤ 1.25: {row[0]}", x, None if x is None else x <= 1.25,
                    f"{w.extra_tables[0][1][-1]} vs {w.extra_tables[0][1][1]}")
    else:
        add("w7 dispatch p50 at 200k ≤ 1.25x p50 at 1k", None, None, skipped("w7"))
    for v in ("workers=1", "workers=2"):
        r = ratio_of_medians("w8", v, "pgque", "skiplocked")
        add(f"w8 end-to-end jobs/s {v} ≥ 2x SKIP LOCKED", r, None if r is None else r >= 2.0, skipped("w8") if r is None else "median pgque / skiplocked")
    w = W.get("w9")
    if w and any(sys_.startswith("pgque") for sys_ in w.systems("during")):
        for s_ in [x for x in w.systems("during") if x.startswith("pgque")]:
            d = w.last("during", s_, "dead") or {}
            ev = sum(n for t, n in d.items() if ".event_" in t)
            other = {t: n for t, n in d.items() if ".event_" not in t}
            if s_.endswith("events"):
                add(f"w9 {s_}: event tables 0 dead tuples at the end of the held-xmin phase", ev, ev == 0, "sum of n_dead_tup over pgque.event_*")
            top = max(other.items(), key=lambda kv: kv[1]) if other else None
            add(f"w9 {s_}: other pgque tables bounded during the held xmin (largest shown; judge the bound by the phase table)",
                top[1] if top else 0, None, f"{top[0]}" if top else "no dead tuples")
    else:
        add("w9 held xmin: pgque tables bounded", None, None, skipped("w9"))
    return rows


def kept_history(path):
    """The trailing `## History` section of an existing results file, or "".

    A results file is one per workload family (benches/README.md, "Results
    files": the current run, then a history table). A rerun replaces the run's
    sections and keeps the history, so that it is carried over rather than lost:
    the section
    kept is the one from a line `## History` to the end of the file, and only if
    no other `## ` heading follows it (a file whose history sits elsewhere is
    rewritten whole, and the caller warns).
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return ""
    starts = [i for i, l in enumerate(lines) if l.startswith("## ")]
    if not starts or lines[starts[-1]].strip() != "## History":
        return ""
    return "\n".join(lines[starts[-1]:]).rstrip("\n") + "\n"


def has_history(path):
    try:
        with open(path) as f:
            return any(l.strip() == "## History" for l in f)
    except FileNotFoundError:
        return False


def write(path, res, header_lines, png=None, history=""):
    out = list(header_lines)
    if png:
        import os
        out += [f"![throughput and dispatch latency]({os.path.basename(png)})", ""]
    out += ["## The issue's targets, from this run's figures", "",
            "| target | measured | met | how |", "|---|---|---|---|"]
    for name, val, ok, how in targets(res):
        out.append(f"| {name} | {fmt(val)} | {'–' if ok is None else ('yes' if ok else '**no**')} | {how} |")
    out.append("")
    out += ["## Workloads", ""]
    for w in res.workloads:
        out += workload_md(w)
    if history:
        out += [history.rstrip("\n")]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
