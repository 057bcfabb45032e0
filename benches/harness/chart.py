"""Optional PNG chart next to the results file (matplotlib; skipped if missing):
left, median throughput per system for the send and drain workloads; right,
median dispatch p50 against ready depth (workload 7)."""


def write(png_path, res):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    W = {w.wid: w for w in res.workloads}
    bars = []  # (label, system, value)
    for wid in ("w1", "w2", "w3"):
        w = W.get(wid)
        if not w:
            continue
        for v in w.variants():
            for s in w.systems(v):
                m = w.med(v, s, "rate")
                if m:
                    bars.append((f"{wid} {v}", s, m))
    w7 = W.get("w7")
    if not bars and not (w7 and w7.cells):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(15, 6))
    ax = axes[0]
    if bars:
        groups = []
        for g, _, _ in bars:
            if g not in groups:
                groups.append(g)
        systems = []
        for _, s, _ in bars:
            if s not in systems:
                systems.append(s)
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            xs, ys = [], []
            for gi, g in enumerate(groups):
                for gg, ss, val in bars:
                    if gg == g and ss == s:
                        xs.append(gi + i * width)
                        ys.append(val)
            ax.bar(xs, ys, width, label=s)
        ax.set_xticks([gi + 0.4 - width / 2 for gi in range(len(groups))])
        ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("events/s (median of rounds, log scale)")
        ax.set_title("send (w1, w2) and drain (w3)")
        ax.legend(fontsize=7)
    ax = axes[1]
    if w7 and w7.cells:
        variants = w7.variants()
        depths = [int(v.split("=")[1].replace(",", "")) for v in variants]
        names = []
        for v in variants:
            for s in w7.systems(v):
                if s not in names:
                    names.append(s)
        for s in names:
            ys = [w7.med(v, s, "p50") for v in variants]
            ax.plot(depths, ys, marker="o", label=s)
        ax.set_xscale("log")
        ax.set_xlabel("ready jobs (depth)")
        ax.set_ylabel("dispatch p50, ms (median of rounds)")
        ax.set_title("dispatch latency vs depth (w7)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)
    plt.close(fig)
    return png_path
