#!/usr/bin/env python3
"""Plots bench/run's raw JSON lines as PNGs (matplotlib, Agg backend) for bench/RESULTS.md.

    plots.py RAW [OUT_DIR]      (OUT_DIR default bench/plots)

Writes, for whatever the raw file holds (missing workloads are skipped):
  lifecycle_cdf.png         serial create -> exec -> destroy latency CDF per system (log x)
  lifecycle_throughput.png  cycles/s vs workers per system
  exec_cdf.png              exec `true` in a live DSec sandbox, per worker count
  api_cdf.png               the cycle through the REST API, per client count
  fncall_cdf.png            serial function-call latency CDF per system
  fncall_throughput.png     calls/s vs clients per system
  episode_cdf.png           serial episode latency CDF per system
  episode_throughput.png    episodes/s vs concurrency per system
  scaling_memory.png        edge RSS and host memory (total and per sandbox) vs live sandboxes
  scaling_latency.png       create and exec latency (p50, p99) vs live sandboxes
Records from several rounds are combined by taking the median of each percentile (CDFs) or
of the rates. Prints the names of the files it wrote.
"""
import collections
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

import rawjson  # noqa: E402


def plain_log_ticks(axis):
    """Label a log axis at 1, 2, 5 x 10^k in plain numbers (not only at the decades)."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda x, _: ""))

# One colour and marker per system across every plot.
STYLE = {
    "dsec": ("#d62728", "o"), "dsec-edge": ("#d62728", "o"), "dsec-pool": ("#ff7f0e", "D"),
    "bwrap": ("#1f77b4", "s"), "crun": ("#2ca02c", "^"), "runsc": ("#9467bd", "v"),
    "sfl": ("#8c564b", "P"), "fork+exec": ("#7f7f7f", "x"), "cold-python": ("#bcbd22", "*"),
    "qemu-microvm": ("#17becf", "h"), "fork-server": ("#7f7f7f", "x"),
    "bwrap+python": ("#1f77b4", "s"),
}
ORDER = ["dsec", "dsec-edge", "dsec-pool", "bwrap", "bwrap+python", "crun", "runsc", "sfl",
         "fork+exec", "fork-server", "cold-python", "qemu-microvm"]


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load(path):
    rows = collections.defaultdict(list)
    scaling = []
    for r in rawjson.records(path):
        w = r.get("workload")
        if w == "scaling":
            scaling.append(r)
        elif "system" in r and "concurrency" in r:
            rows[(w, r["system"], r["concurrency"])].append(r)
    return rows, scaling


def median_cdf(recs):
    cdfs = [r["cdf"] for r in recs if len(r.get("cdf") or []) == 101]
    if not cdfs:
        return None
    return [statistics.median(c[i] for c in cdfs) for i in range(101)]


def sort_systems(names):
    return sorted(names, key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))


def style(s, i=0):
    c, m = STYLE.get(s, (f"C{i % 10}", "o"))
    return {"color": c, "marker": m}


def cdf_plot(rows, workload, conc, title, path, label_by="system", xlabel="latency (ms)"):
    keys = [k for k in rows if k[0] == workload and (conc is None or k[2] == conc)]
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 5))
    keys.sort(key=lambda k: (ORDER.index(k[1]) if k[1] in ORDER else len(ORDER), k[1], k[2]))
    plotted = 0
    for i, k in enumerate(keys):
        cdf = median_cdf(rows[k])
        if cdf is None:
            continue
        label = k[1] if label_by == "system" else f"{k[2]} at a time" + (
            "" if k[1] in ("dsec", "dsec-edge") else f" ({k[1]})")
        st = style(k[1], i) if label_by == "system" else {"color": f"C{i % 10}", "marker": None}
        ax.plot([max(x, 1e-3) for x in cdf], [p / 100 for p in range(101)], label=label,
                color=st["color"], linewidth=1.8)
        plotted += 1
    if not plotted:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel(xlabel + ", log scale")
    ax.set_ylabel("fraction of runs at or below")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return save(fig, path)


def throughput_plot(rows, workload, title, ylabel, path):
    keys = [k for k in rows if k[0] == workload]
    systems = sort_systems({k[1] for k in keys})
    if not systems:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 5))
    concs = set()
    for i, s in enumerate(systems):
        pts = sorted((k[2], statistics.median(r["rate"] for r in rows[k])) for k in keys
                     if k[1] == s)
        pts = [p for p in pts if p[1] > 0]
        if not pts:
            continue
        concs.update(p[0] for p in pts)
        st = style(s, i)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=s, color=st["color"],
                marker=st["marker"], linewidth=1.8)
    if not concs:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xticks(sorted(concs))
    ax.set_xticklabels([str(c) for c in sorted(concs)])
    ax.set_xlabel("concurrent workers / clients")
    ax.set_ylabel(ylabel + ", log scale")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return save(fig, path)


def scaling_plots(scaling, out):
    if not scaling:
        return []
    pts = sorted(scaling, key=lambda r: r["live"])
    live = [r["live"] for r in pts]
    written = []
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    if any("host_used_kb" in r for r in pts):
        a1.plot(live, [r.get("host_used_kb", 0) / 1024 for r in pts], marker="o",
                color="#1f77b4", label="host memory used (MemTotal - MemAvailable delta)")
    if any("edge_rss_kb" in r for r in pts):
        a1.plot(live, [r.get("edge_rss_kb", 0) / 1024 for r in pts], marker="s",
                color="#d62728", label="dsec-edge RSS")
    a1.set_xlabel("live idle sandboxes")
    a1.set_ylabel("MiB")
    a1.set_title("Memory vs live sandboxes")
    a1.grid(True, alpha=0.3)
    a1.legend(fontsize=8)
    if any("host_per_sandbox_kb" in r for r in pts):
        a2.plot(live, [r.get("host_per_sandbox_kb", 0) for r in pts], marker="o",
                color="#1f77b4", label="host memory per sandbox")
        a2.axhline(2048, color="#7f7f7f", linestyle="--", label="goal: 2 MiB")
    a2.set_xscale("log")
    plain_log_ticks(a2.xaxis)
    a2.set_xlabel("live idle sandboxes, log scale")
    a2.set_ylabel("kB per sandbox")
    a2.set_title("Host memory per sandbox")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=8)
    written.append(save(fig, os.path.join(out, "scaling_memory.png")))

    fig, ax = plt.subplots(figsize=(8, 5))
    for key, color, ls, label in (("create_p50", "#2ca02c", "-", "create p50"),
                                  ("create_p99", "#2ca02c", "--", "create p99"),
                                  ("exec_p50", "#d62728", "-", "exec p50"),
                                  ("exec_p99", "#d62728", "--", "exec p99")):
        if any(key in r for r in pts):
            ax.plot([r["live"] for r in pts if key in r], [r[key] for r in pts if key in r],
                    color=color, linestyle=ls, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("live idle sandboxes, log scale")
    ax.set_ylabel("latency (ms), log scale")
    ax.set_title("Create and exec latency vs live sandboxes (through the API)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9)
    written.append(save(fig, os.path.join(out, "scaling_latency.png")))
    return written


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    raw = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "plots")
    os.makedirs(out, exist_ok=True)
    rows, scaling = load(raw)
    j = lambda n: os.path.join(out, n)  # noqa: E731
    written = [
        cdf_plot(rows, "lifecycle", 1, "create -> exec `true` -> destroy, one at a time",
                 j("lifecycle_cdf.png")),
        throughput_plot(rows, "lifecycle", "create -> exec `true` -> destroy: throughput",
                        "cycles/s", j("lifecycle_throughput.png")),
        cdf_plot(rows, "exec", None, "exec `true` in a live DSec sandbox", j("exec_cdf.png"),
                 label_by="concurrency"),
        cdf_plot(rows, "api", None, "create -> exec -> delete through the REST API (SDK)",
                 j("api_cdf.png"), label_by="concurrency"),
        cdf_plot(rows, "fncall", 1, "python function call `print(1)`, one at a time",
                 j("fncall_cdf.png")),
        throughput_plot(rows, "fncall", "python function calls: throughput", "calls/s",
                        j("fncall_throughput.png")),
        cdf_plot(rows, "episode", 1, "episode (write files, pytest, read results), one at a time",
                 j("episode_cdf.png")),
        throughput_plot(rows, "episode", "episodes: throughput", "episodes/s",
                        j("episode_throughput.png")),
    ] + scaling_plots(scaling, out)
    for p in written:
        if p:
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
