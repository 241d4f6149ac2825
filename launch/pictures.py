"""Pictures: a plan's pipeline schedule as a Gantt chart, its placement on the cluster, and a
cluster's bandwidth matrix as a heatmap.

matplotlib (Agg backend) is imported lazily, inside each function.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from model.cluster import ClusterSpec
from model.errors import SpecError
from model.plan import Placement, Plan, slot_label

SLOW_FACTOR = 0.75  # a link below this fraction of the median inter-node bandwidth is "slow"
# the picture formats written, by file suffix (matplotlib's savefig formats; `g.pdf` had been
# given PNG bytes under that name)
PICTURE_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def picture_format(path, field: str) -> str:
    """The format a picture's file name asks for (its suffix; PNG for a name without one, as
    before suffixes chose the format), or one line refusing another suffix."""
    suffix = Path(path).suffix.lower()
    fmt = PICTURE_FORMATS.get(suffix) if suffix else "png"
    if fmt is None:
        raise SpecError(f"a picture is written as {', '.join(PICTURE_FORMATS)}; give a file "
                        "name ending in one of them", source=str(path), field=field)
    return fmt


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def schedule_timeline(evaluator, placement: Placement, replica: int | None = None) -> dict:
    """Start, duration and label of every node of one replica's schedule graph, and the
    critical path (node ids). Default replica: the slowest."""
    sh = evaluator.shape
    cs = evaluator.cs
    tails, _ = evaluator.tails(placement)
    durs = [evaluator.replica_durations(placement, r, tails) for r in range(sh.cols)]
    if replica is None:
        replica = int(np.argmax([cs.longest_path(d) for d in durs]))
    if not 0 <= replica < sh.cols:
        raise SpecError(f"replica {replica} does not exist; the plan has {sh.cols} "
                        "(replicas x CP ranks)",
                        source="options", field="replica")
    d = durs[replica]
    start = cs.start_times(d)
    dur = np.asarray(d)[cs.kind_of]
    length, _counts, path = cs.critical_path(d)
    return {"replica": replica, "start": start, "dur": dur, "labels": cs.labels,
            "critical": set(path), "length": float(length)}


def gantt_png(evaluator, placement: Placement, path, replica: int | None = None) -> Path:
    """The schedule of one data-parallel replica as a Gantt chart PNG: one row per stage,
    forward (blue) and backward (orange) of each micro-batch (darker for later model chunks),
    transfers as grey lines between rows, the tail (gradient sync + optimizer) in grey, the
    critical path outlined in red, and idle time (the bubble) as the light background."""
    plt = _plt()
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    t = schedule_timeline(evaluator, placement, replica)
    sh = evaluator.shape
    p, v = sh.pp, sh.chunks
    start, dur, labels, crit = t["start"], t["dur"], t["labels"], t["critical"]
    length = t["length"]
    many = evaluator.m * v > 24
    fig_w = min(28.0, 10.0 + 0.08 * evaluator.m * v)
    fig, ax = plt.subplots(figsize=(fig_w, 1.0 + 0.7 * p))
    fcol = plt.get_cmap("Blues")
    bcol = plt.get_cmap("Oranges")
    h = 0.7
    for s in range(p):  # idle background: whatever the bars do not cover is bubble
        ax.broken_barh([(0, length)], (s - h / 2, h), facecolors="#f3e6e6", zorder=0)
    bars: dict[tuple, list] = {}
    crit_bars = []
    for i, lab in enumerate(labels):
        if lab[0] in ("F", "B"):
            k, mb, j, s = lab
            c = j // p
            shade = 0.45 + 0.4 * (c / max(1, v - 1)) if v > 1 else 0.6
            col = fcol(shade) if k == "F" else bcol(shade)
            bars.setdefault(col, []).append((s, (start[i], dur[i])))
            if i in crit:
                crit_bars.append((s, (start[i], dur[i])))
            if not many and dur[i] > 0:
                ax.text(start[i] + dur[i] / 2, s, str(mb), ha="center", va="center",
                        fontsize=7, zorder=4)
        elif lab[0] == "T":
            s = lab[1]
            ax.broken_barh([(start[i], dur[i])], (s - h / 2, h), facecolors="#9e9e9e",
                           edgecolor="red" if i in crit else "none", hatch="//", zorder=2)
    for col, items in bars.items():
        for s in range(p):
            segs = [seg for ss, seg in items if ss == s]
            if segs:
                ax.broken_barh(segs, (s - h / 2, h), facecolors=col, edgecolor="white",
                               linewidth=0.3, zorder=2)
    for s in range(p):
        segs = [seg for ss, seg in crit_bars if ss == s]
        if segs:
            ax.broken_barh(segs, (s - h / 2, h), facecolors="none", edgecolor="red",
                           linewidth=1.2, zorder=3)
    for i, lab in enumerate(labels):  # transfers: from the sender's row to the receiver's
        if lab[0] != "X":
            continue
        src, dst = labels[lab[1]], labels[lab[2]]
        ys, yd = src[3], dst[3]
        on = i in crit
        ax.plot([start[i], start[i] + dur[i]], [ys + (h / 2 if yd > ys else -h / 2),
                                                yd - (h / 2 if yd > ys else -h / 2)],
                color="red" if on else "#555555", linewidth=1.4 if on else 0.5,
                alpha=1.0 if on else 0.6, zorder=3)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {s}" for s in range(p)])
    ax.set_xlim(0, length * 1.01)
    ax.set_xlabel("time (ms)")
    # the shape's description is long: on two lines, smaller, so it is never clipped
    ax.set_title(f"{sh.describe()}\nreplica {t['replica']}, iteration {length:,.0f} ms, "
                 f"{evaluator.m} micro-batches", fontsize=9)
    ax.legend(handles=[Patch(color=fcol(0.6), label="forward"),
                       Patch(color=bcol(0.6), label="backward"),
                       Patch(facecolor="#9e9e9e", hatch="//", label="grad sync + optimizer"),
                       Patch(color="#f3e6e6", label="idle (bubble)"),
                       Line2D([], [], color="#555555", label="transfer"),
                       Line2D([], [], color="red", label="critical path")],
              loc="upper center", bbox_to_anchor=(0.5, -0.16 - 0.03 * (4 - min(p, 4))),
              ncol=6, fontsize=8, frameon=False)
    return _save(fig, path)


def _save(fig, path, field: str = "--gantt/--placement-png", dpi: int = 110) -> Path:
    """Lay out, render, write (creating the folder; formats.atomic: the previous file stays
    whole if writing fails) and close a figure."""
    import io

    from formats.atomic import write_atomic

    plt = _plt()
    try:
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=picture_format(path, field), dpi=dpi)
    finally:
        plt.close(fig)
    return write_atomic(Path(path), buf.getvalue(), field=field)


def slow_links(cluster: ClusterSpec, factor: float = SLOW_FACTOR) -> list[tuple[int, int]]:
    """Directed node pairs whose bandwidth is below `factor` x the median off-diagonal one."""
    m = cluster.inter_gb_per_s
    n = cluster.num_nodes
    if n < 2:
        return []
    off = ~np.eye(n, dtype=bool)
    med = float(np.median(m[off]))
    return [(a, b) for a in range(n) for b in range(n) if a != b and m[a, b] < factor * med]


def slow_nodes(cluster: ClusterSpec) -> set[int]:
    """The nodes `cluster show` and `solve` call slow (formats.bandwidth.summarize's outliers:
    a degraded NIC or NVLink), which the placement picture frames. Every node with a slow link
    had been framed: all of them, beside one degraded node."""
    from formats.bandwidth import outlier_nodes

    return {n for n, _link, _o in outlier_nodes(cluster)}


def placement_png(cluster: ClusterSpec, plan: Plan, path) -> Path:
    """Nodes as rows of GPU cells coloured by pipeline stage (hue) and labelled s<stage>/r<replica>
    (replicas alternate lightness); next to it the inter-node bandwidth matrix with slow links
    (< 0.75 x median) outlined red and the node pairs the plan's pipeline hops use dotted."""
    plt = _plt()
    from matplotlib.patches import Rectangle

    sh, pl = plan.shape, plan.placement
    N = cluster.num_nodes
    Gmax = max(nd.num_gpus for nd in cluster.nodes)
    cmap = plt.get_cmap("tab10" if sh.pp <= 10 else "tab20")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(6 + 0.6 * Gmax + 0.35 * N, 1.5 + 0.55 * N),
                                  gridspec_kw={"width_ratios": [Gmax + 2, max(N, 4)]})
    owner = {}
    for s in range(sh.pp):
        for r in range(sh.cols):
            for i, g in enumerate(pl.gpus[s][r]):
                owner[(pl.node[s][r], g)] = (s, r, i)
    slow = slow_links(cluster)
    framed = slow_nodes(cluster)
    for n, nd in enumerate(cluster.nodes):
        for g in range(nd.num_gpus):
            o = owner.get((n, g))
            if o is None:
                fc, txt = "#eeeeee", "-"
            else:
                s, r, i = o
                base = np.array(cmap(s % cmap.N)[:3])
                # shade by replica (a column is replica x CP + CP rank)
                fc = tuple(base if (r // sh.cp) % 2 == 0 else 0.55 * base + 0.45)
                txt = slot_label(s, r, sh.cp)
            ax.add_patch(Rectangle((g, n), 0.92, 0.85, facecolor=fc, edgecolor="black",
                                   linewidth=0.4))
            ax.text(g + 0.46, n + 0.43, txt, ha="center", va="center", fontsize=7)
        ax.add_patch(Rectangle((-0.08, n - 0.06), nd.num_gpus + 0.08, 0.97, fill=False,
                               edgecolor="red" if n in framed else "none", linewidth=1.5))
    ax.set_xlim(-0.2, Gmax + 0.1)
    ax.set_ylim(N, -0.2)
    ax.set_yticks([n + 0.43 for n in range(N)])
    ax.set_yticklabels([f"{nd.name} ({nd.gpu.name})" for nd in cluster.nodes], fontsize=8)
    ax.set_xticks([g + 0.46 for g in range(Gmax)])
    ax.set_xticklabels([f"GPU{g}" for g in range(Gmax)], fontsize=7)
    ax.set_title(f"{sh.describe()}\ncolour = stage, dark/light = even/odd replica; red frame = "
                 "slow node (cluster show)", fontsize=9)
    for sp in ax.spines.values():
        sp.set_visible(False)
    m = cluster.inter_gb_per_s.copy()
    np.fill_diagonal(m, np.nan)
    im = ax2.imshow(m, cmap="viridis")
    fig.colorbar(im, ax=ax2, fraction=0.046, pad=0.04, label="GB/s per stream")
    for a, b in slow:
        ax2.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, edgecolor="red",
                                linewidth=2))
    used = set()
    hops = sh.pp if sh.chunks > 1 else sh.pp - 1
    for r in range(sh.cols):
        for hh in range(hops):
            a, b = pl.node[hh][r], pl.node[(hh + 1) % sh.pp][r]
            if a != b:
                used.add((a, b))
                used.add((b, a))
    for a, b in used:
        ax2.plot(b, a, "o", color="white", markersize=4, markeredgecolor="black")
    names = [nd.name for nd in cluster.nodes]
    ax2.set_xticks(range(N))
    ax2.set_xticklabels(names, rotation=90, fontsize=7)
    ax2.set_yticks(range(N))
    ax2.set_yticklabels(names, fontsize=7)
    ax2.set_title(f"inter-node bandwidth; red = slow (< {SLOW_FACTOR} x median), "
                  "dot = pipeline hop", fontsize=9)
    return _save(fig, path)


def heatmap_png(c, path: str | Path) -> None:
    """Write a heatmap of the inter-node matrix (row = sender, column = receiver)."""
    plt = _plt()

    names = [nd.name for nd in c.nodes]
    n = len(names)
    m = np.array(c.inter_gb_per_s, dtype=float)
    np.fill_diagonal(m, np.nan)
    size = min(4 + 0.35 * n, 30)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(np.ma.masked_invalid(m), cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="GB/s, one GPU-to-GPU stream")
    if n <= 64:
        ax.set_xticks(range(n), names, rotation=90, fontsize=max(4, 10 - n // 8))
        ax.set_yticks(range(n), names, fontsize=max(4, 10 - n // 8))
    ax.set_xlabel("to node")
    ax.set_ylabel("from node")
    ax.set_title(f"{c.name}: inter-node bandwidth")
    _save(fig, path, field="--png", dpi=100)
