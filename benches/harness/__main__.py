"""The benchmark harness: `python3 -m harness` (run by benches/run.sh, `make bench`).

Runs workloads w1..w9 (see w_events.py, w_jobs.py, w_xmin.py) against the bench
cluster started by run.sh and writes benches/results/overview.md (a run of every
workload), benches/results/quick.md (QUICK=1) or benches/results/partial.md (ONLY=
without BENCH_OUT); the last two are git-ignored scratch files. The results file
is rewritten after every workload, so an interrupted run keeps what it measured,
and a trailing `## History` section already in it is kept (one file per workload
family, its history table at the end: benches/README.md). A workload that fails
is reported as failed with its error; one whose pgque functions are missing is
reported as skipped; no figure is invented.
"""
import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
import traceback

from . import chart, db, report, w_events, w_interval, w_jobs, w_profile, w_xmin
from .core import Results, progress

WORKLOADS = {
    "w1": w_events.w1, "w2": w_events.w2, "w3": w_events.w3, "w4": w_events.w4, "w5": w_events.w5,
    "w6": w_jobs.w6, "w7": w_jobs.w7, "w8": w_jobs.w8, "w9": w_xmin.w9, "w10": w_interval.w10,
    "w11": w_profile.w11, "w12": w_profile.w12, "w13": w_profile.w13,
}


class Config:
    def __init__(self, quick, rounds):
        self.quick = quick
        self.rounds = rounds
        self.send_secs = 3 if quick else 20
        self.send_batches = [100, 1000]
        self.backlog = 30_000 if quick else 200_000
        self.drain_batches = [100, 500]
        self.lat_secs = 4 if quick else 30
        self.lat_rates = [500, 2000]
        if os.environ.get("W4_RATES"):  # e.g. W4_RATES=500: only the 500 events/s cells
            self.lat_rates = [int(r) for r in os.environ["W4_RATES"].split(",")]
        # w4's first send after an idle spell of this many seconds (0: not measured)
        self.idle_secs = int(os.environ.get("W4_IDLE_SECS", "10" if quick else "60"))
        self.poll_ms = 10
        self.pgq_tick_ms = 100
        self.enq_secs = 2 if quick else 10
        self.enq_batches = [1, 10, 100, 1000]
        self.enq_clients = [1, 2]
        self.w7_depths = [1_000, 10_000, 50_000] if quick else [1_000, 10_000, 50_000, 200_000]
        if os.environ.get("W7_DEPTHS"):  # e.g. W7_DEPTHS=1000,200000: the deep end in a QUICK run
            self.w7_depths = [int(d) for d in os.environ["W7_DEPTHS"].split(",")]
        self.w7_samples = 30 if quick else 200
        self.w7_limit = 50
        self.w8_secs = 4 if quick else 30
        self.w9_secs = 8 if quick else 60
        self.w5_events = 20_000 if quick else 100_000
        # w10: events in one tick interval (W10_SIZES=100000,1000000 in a QUICK run)
        self.w10_sizes = [20_000, 100_000] if quick else [100_000, 1_000_000]
        if os.environ.get("W10_SIZES"):
            self.w10_sizes = [int(d) for d in os.environ["W10_SIZES"].split(",")]
        # w11: the seed's profile (W11_RATE events/s, W11_SECS per cell, lease ttl W11_TTL s),
        # then the rate search (W11_SEARCH rates, W11_SEARCH_SECS each)
        self.w11_rate = int(os.environ.get("W11_RATE", "5000"))
        self.w11_secs = int(os.environ.get("W11_SECS", "20" if quick else "60"))
        self.w11_ttl = int(os.environ.get("W11_TTL", "5" if quick else "10"))
        self.w11_zipf = 1.1  # random_zipfian(1, 2000, 1.1), as the seed's run
        self.w11_search = [int(x) for x in os.environ.get(
            "W11_SEARCH", "5000,10000,15000" if quick else "5000,7500,10000,12500,15000,20000,25000").split(",")]
        self.w11_search_secs = int(os.environ.get("W11_SEARCH_SECS", "10" if quick else "20"))
        # w12: w11's profile under the pause policy; probability that a delivery fails
        self.w12_nack_p = float(os.environ.get("W12_NACK_P", "0.002"))
        # w12 / w13: worker kills of each kind (SIGKILL, pg_terminate_backend) per kill cell
        self.w11_kills = int(os.environ.get("W11_KILLS", "4"))
        # CELL_SCALE=0.5: every timed cell (sends, latency, enqueue, end-to-end,
        # held-xmin phases) half as long; rounds, backlogs and depths unchanged.
        scale = float(os.environ.get("CELL_SCALE", "1"))
        if not 0.1 <= scale <= 10:
            sys.exit("CELL_SCALE must be within 0.1..10")
        for attr in ("send_secs", "lat_secs", "enq_secs", "w8_secs", "w9_secs"):
            setattr(self, attr, max(1, round(getattr(self, attr) * scale)))

    def describe(self):
        return (f"rounds {self.rounds}; send cells {self.send_secs} s; backlog {self.backlog:,}; drain batches "
                f"{self.drain_batches}; latency cells {self.lat_secs} s at {self.lat_rates} ev/s; enqueue cells "
                f"{self.enq_secs} s; dispatch depths {self.w7_depths}, {self.w7_samples} samples, limit {self.w7_limit}; "
                f"end-to-end cells {self.w8_secs} s; held-xmin phases {self.w9_secs} s per system; one-interval drains "
                f"{self.w10_sizes}; profile cells {self.w11_secs} s at {self.w11_rate:,} ev/s, search {self.w11_search}")


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return "?"


def header(cfg, conn, cmdline, started):
    ver, settings, exts, plen = db.settings(conn)
    mem = sh("free -g | awk '/Mem:/{print $2}'")
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    commit = sh("git rev-parse --short HEAD") + (" (dirty)" if sh("git status --porcelain -- ../src ../sql ../benches") else "")
    branch = sh("git rev-parse --abbrev-ref HEAD")
    load = sh("cat /proc/loadavg")
    lines = [f"# pgque benchmarks — {started:%Y-%m-%d %H:%M} UTC" + (" — QUICK run (short cells, noisy)" if cfg.quick else ""), ""]
    if cfg.quick:
        lines += ["> **QUICK=1 development run.** Short cells and small backlogs on a machine shared with "
                  "compiling engineers: these figures show the harness and the format, they are noisy and "
                  "are not the project's claims. The full run is `make bench` on a quiet machine.", ""]
    lines += [
        "## How this was made", "",
        f"- command: `{cmdline}`",
        f"- source: branch `{branch}`, commit {commit}" + (f" — {os.environ['BENCH_SOURCE_NOTE']}" if os.environ.get("BENCH_SOURCE_NOTE") else ""),
        f"- config: {cfg.describe()}",
        f"- machine: {os.cpu_count()} CPUs ({cpu}), {mem} GB RAM, {platform.platform()}",
        f"- load average at start: {load}",
        f"- server: {ver}",
        "- extensions: " + ", ".join(f"{n} {v}" for n, v in exts),
        f"- payload: a {plen}-byte JSON object as text (`" + db.payload_sql("n") + "`)",
        "- every cell starts from a fresh queue or truncated table; rounds interleave the systems (A B C, A B C, ...)",
        "", "settings:", "", "| setting | value |", "|---|---|",
    ]
    for name, setting, unit in settings:
        lines.append(f"| {name} | {setting}{(' ' + unit) if unit else ''} |")
    lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser(description="pgque side-by-side benchmarks (issue 8)")
    ap.add_argument("--quick", action="store_true", default=os.environ.get("QUICK") == "1")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "3")))
    ap.add_argument("--only", default=os.environ.get("ONLY", ""), help="comma list, e.g. w1,w3")
    ap.add_argument("--out", default=os.environ.get("BENCH_OUT", ""))
    args = ap.parse_args()
    if args.rounds < 3 and not args.quick:
        sys.exit("at least 3 rounds (ROUNDS=3) outside QUICK mode")
    cfg = Config(args.quick, args.rounds)
    started = datetime.datetime.now(datetime.timezone.utc)
    # One file per workload family, not one per attempt: a full run replaces
    # overview.md's figures (keeping its history); QUICK and partial runs go to
    # git-ignored scratch files unless BENCH_OUT names a family file.
    default = "quick.md" if cfg.quick else ("partial.md" if args.only.strip() else "overview.md")
    out = args.out or os.path.join(os.path.dirname(__file__), "..", "results", default)
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    history = report.kept_history(out)
    if history:
        progress(f"keeping the ## History section of {out}: add this run's line to it")
    elif report.has_history(out):
        progress(f"WARNING: {out} has a ## History section that is not its last section; "
                 "the run rewrites the whole file: carry the history over by hand (git diff)")
    env = " ".join(f"{k}={os.environ[k]}" for k in ("QUICK", "ROUNDS", "ONLY", "W7_DEPTHS", "W10_SIZES", "W10_BATCH", "W10_PGQ", "CELL_SCALE", "W11_RATE", "W11_SECS", "W11_TTL", "W11_SEARCH", "W11_SEARCH_SECS", "W11_KILLS", "W12_CELLS", "W13_CELLS") if os.environ.get(k))
    cmdline = (env + " " if env else "") + "make bench" + (" -- " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    only = [x.strip() for x in args.only.split(",") if x.strip()] or list(WORKLOADS)

    conn = db.connect()
    hdr = header(cfg, conn, cmdline, started)
    res = Results()
    progress(f"results -> {out}")
    progress(cfg.describe())
    for wid in only:
        t0 = time.time()
        progress(f"== {wid}")
        n_before = len(res.workloads)
        try:
            WORKLOADS[wid](res, cfg, conn)
        except Exception as e:
            traceback.print_exc()
            if len(res.workloads) > n_before:
                w = res.workloads[-1]
            else:
                w = res.workload(wid, "(failed before it started)", [("rate", "rate")])
            w.note(f"FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''} — the figures above are the cells finished before the failure")
            progress(f"{wid}: FAILED: {e}")
            conn.close()
            conn = db.connect()
        if len(res.workloads) > n_before:
            res.workloads[-1].seconds = time.time() - t0
        png = None
        try:
            png = chart.write(out[:-3] + ".png", res)
        except Exception as e:  # a chart is a nicety; never lose the figures over it
            progress(f"chart not written: {e}")
        report.write(out, res, hdr + [f"- total wall time so far: {time.time() - started.timestamp():.0f} s", ""], png,
                     history)
    progress(f"done in {time.time() - started.timestamp():.0f} s; results in {out}")
    if history:
        progress("the history section was kept: add a line for this run, and the hand-written reading")


if __name__ == "__main__":
    main()
