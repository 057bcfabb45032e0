"""Results model, progress lines and the interleaved-rounds runner.

A *cell* is one (workload, variant, system, round) measurement. Workloads run
their cells round by round, every system once per round (A B C, A B C, ...), so
slow drift of the machine hits every system alike. Each cell records a dict of
metrics; the report prints per-round values, the median, and the ratio of each
pgque system to each reference per round.
"""
import statistics
import sys
import time


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pct(xs, p):
    """Nearest-rank percentile of a list of numbers."""
    xs = sorted(xs)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def progress(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Workload:
    def __init__(self, wid, title, metrics, higher_is_better=True, about=""):
        self.wid = wid
        self.title = title
        # [(key, label)]: the first is the primary metric (per-round values, ratios).
        self.metrics = metrics
        self.higher_is_better = higher_is_better
        self.about = about
        self.cells = []  # (variant, system, round, metrics)
        self.skipped = []  # lines
        self.notes = []  # free text lines
        self.extra_tables = []  # (title, header, rows)
        self.profiles = []  # (variant, system, rnd, rows of db.pgss_top)
        self.started = None
        self.seconds = None

    def skip(self, what):
        line = f"{self.wid}: skipped: {what}"
        self.skipped.append(what)
        progress(line)

    def profile(self, variant, system, rnd, rows):
        self.profiles.append((variant, system, rnd, rows))

    def note(self, text):
        self.notes.append(text)

    def add(self, variant, system, rnd, metrics):
        self.cells.append((variant, system, rnd, metrics))
        prim, label = self.metrics[0]
        v = metrics.get(prim)
        rest = []
        for k, lab in self.metrics[1:]:
            if metrics.get(k) is not None:
                rest.append(f"{lab} {fmt(metrics[k])}")
        dead = metrics.get("dead")
        if isinstance(dead, dict):
            rest.append(f"dead tuples {sum(dead.values())}")
        progress(f"{self.wid} {variant} | {system} | round {rnd}: {label} {fmt(v)}" + ("; " + "; ".join(rest) if rest else ""))

    # ---- queries over the cells ---------------------------------------------------
    def variants(self):
        seen = []
        for v, _, _, _ in self.cells:
            if v not in seen:
                seen.append(v)
        return seen

    def systems(self, variant):
        seen = []
        for v, s, _, _ in self.cells:
            if v == variant and s not in seen:
                seen.append(s)
        return seen

    def rounds(self, variant):
        return sorted({r for v, _, r, _ in self.cells if v == variant})

    def value(self, variant, system, rnd, key):
        for v, s, r, m in self.cells:
            if v == variant and s == system and r == rnd:
                return m.get(key)
        return None

    def values(self, variant, system, key):
        return [m.get(key) for v, s, r, m in self.cells if v == variant and s == system]

    def med(self, variant, system, key):
        return median(self.values(variant, system, key))

    def last(self, variant, system, key):
        vals = [m.get(key) for v, s, r, m in self.cells if v == variant and s == system and m.get(key) is not None]
        return vals[-1] if vals else None


class Results:
    def __init__(self):
        self.workloads = []
        self.header = {}

    def workload(self, wid, title, metrics, higher_is_better=True, about=""):
        w = Workload(wid, title, metrics, higher_is_better, about)
        self.workloads.append(w)
        return w


def fmt(v):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def run_rounds(rounds, systems, cell):
    """Interleave: for r in rounds: for s in systems: cell(s, r)."""
    for r in range(1, rounds + 1):
        for s in systems:
            cell(s, r)


def die(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)
