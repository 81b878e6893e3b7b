#!/usr/bin/env python3
"""The A/B table of `bench/run --baseline`: two builds' DSec figures side by side, per workload,
system, concurrency and metric, with the median over rounds of each side, the delta and
whether it stands out of the rounds' noise. Prints the section (markdown); with --results FILE
it also puts it into FILE as "## A/B: LABEL" (replacing a section of that title, else appended
at the end) and leaves the rest of FILE as it was.

    ab_report.py RAW --label L --baseline DESC --candidate DESC [--command CMD] [--rounds N]
                 [--harness DESC] [--failed STAGES] [--results FILE]

RAW holds bench/run's JSON lines, each tagged by bench/run with "ab_side" (baseline or
candidate) and "ab_round". Noise: a side's spread is (max - min) / median of its per-round
values; a delta is "within noise" when |delta| is below the larger spread of the two sides or
NOISE_FLOOR_PCT, whichever is larger (with one round there is no spread, and no verdict)."""
import argparse
import collections
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys

import rawjson

NOISE_FLOOR_PCT = 3.0
NAN = float("nan")
# (workload, heading) in table order, and per workload the metrics (key, label, higher_is_better).
LAT = [("p50", "p50 ms", False), ("p99", "p99 ms", False)]
WORKLOADS = [
    ("lifecycle", "lifecycle (in-process)",
     LAT + [("rate", "cycles/s", True), ("create_p50", "create p50 ms", False),
            ("exec_p50", "exec p50 ms", False), ("destroy_p50", "destroy p50 ms", False)]),
    ("exec", "exec `true` in a live sandbox", LAT + [("rate", "execs/s", True)]),
    ("api", "API cycle", LAT + [("rate", "cycles/s", True), ("create_p50", "create p50 ms", False),
                                ("exec_p50", "exec p50 ms", False),
                                ("delete_p50", "delete p50 ms", False)]),
    ("fncall", "fncall `print(1)`", LAT + [("rate", "calls/s", True)]),
    ("pool_create", "create from pool / fresh", LAT),
]


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def machine():
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    os_name = subprocess.run(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"],
                             capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} vCPU {cpu_model()}, {mem_gib:.0f} GiB RAM, kernel"
            f" {platform.release()} ({os_name}); load average (1 min) {load:.1f} at the end")


def fmt(v):
    if v is None or math.isnan(v):
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}"


def spread_pct(vals):
    m = statistics.median(vals)
    return 100 * (max(vals) - min(vals)) / m if len(vals) > 1 and m else NAN


def table(raw):
    """Markdown lines of the A/B table and the number of failed cycles/calls per side."""
    # (workload, system, concurrency, side) -> metric -> [value per round]
    vals = collections.defaultdict(lambda: collections.defaultdict(list))
    failures = collections.Counter()
    verdicts = collections.Counter()
    order = []  # systems in order of appearance
    for r in rawjson.records(raw):
        side, w = r.get("ab_side"), r.get("workload")
        if side not in ("baseline", "candidate") or "system" not in r or "concurrency" not in r:
            continue
        failures[side] += int(r.get("failures", 0) or 0) + int(r.get("errors", 0) or 0)
        if r["system"] not in order:
            order.append(r["system"])
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                vals[(w, r["system"], r["concurrency"], side)][k].append(v)
    lines = ["| workload | system | at a time | metric | baseline | candidate | delta |"
             " spread baseline / candidate | |",
             "|---|---|---:|---|---:|---:|---:|---:|---|"]
    for w, heading, metrics in WORKLOADS:
        keys = sorted({(k[1], k[2]) for k in vals if k[0] == w},
                      key=lambda sc: (order.index(sc[0]), sc[1]))
        for system, conc in keys:
            a, b = vals.get((w, system, conc, "baseline"), {}), \
                vals.get((w, system, conc, "candidate"), {})
            for key, label, higher_better in metrics:
                va, vb = a.get(key, []), b.get(key, [])
                if not va and not vb:
                    continue
                ma = statistics.median(va) if va else NAN
                mb = statistics.median(vb) if vb else NAN
                sa, sb = (spread_pct(va) if va else NAN), (spread_pct(vb) if vb else NAN)
                delta = 100 * (mb - ma) / ma if ma and not math.isnan(ma + mb) else NAN
                noise = max([NOISE_FLOOR_PCT] + [s for s in (sa, sb) if not math.isnan(s)])
                if math.isnan(delta):
                    verdict = "one side missing"
                elif len(va) < 2 or len(vb) < 2:
                    verdict = "no spread (1 round)"
                elif abs(delta) < noise:
                    verdict = "within noise"
                else:
                    verdict = "**better**" if (delta > 0) == higher_better else "**worse**"
                verdicts[verdict.strip("*")] += 1
                sp = " / ".join("–" if math.isnan(s) else f"{s:.0f}%" for s in (sa, sb))
                dl = "–" if math.isnan(delta) else f"{delta:+.1f}%"
                lines.append(f"| {heading} | {system} | {conc} | {label} | {fmt(ma)} | {fmt(mb)} |"
                             f" {dl} | {sp} | {verdict} |")
    return lines, failures, verdicts


def section(opts):
    rows, failures, verdicts = table(opts.raw)
    now = datetime.datetime.now(datetime.timezone.utc)
    out = [f"## A/B: {opts.label}", "",
           f"- date: {now:%Y-%m-%d %H:%M UTC}; machine: {machine()}",
           f"- baseline: {opts.baseline}",
           f"- candidate: {opts.candidate}"]
    if opts.command:
        out.append(f"- command: `{opts.command}`")
    out.append(f"- {opts.rounds} interleaved round(s) (odd rounds run the baseline first, even"
               " rounds the candidate), medians over rounds; both sides run the bench scripts of"
               f" {opts.harness} with their own binaries. Spread = (max - min) / median of a"
               " side's rounds; a delta is within noise when it is below the larger spread or"
               f" {NOISE_FLOOR_PCT:.0f}%. Lower is better for ms, higher for /s.")
    if failures["baseline"] or failures["candidate"]:
        out.append(f"- failed cycles or calls: baseline {failures['baseline']}, candidate"
                   f" {failures['candidate']}")
    if opts.failed:
        out.append(f"- failed stages: {opts.failed}")
    n = sum(verdicts.values())
    if n:
        out.append(f"- {verdicts['within noise']} of {n} rows within noise, {verdicts['better']}"
                   f" better, {verdicts['worse']} worse"
                   + (" (the same build on both sides: every better or worse here is noise, a"
                      " measure of how far to trust this host at these counts)"
                      if opts.baseline == opts.candidate else ""))
    out.append("")
    out += rows if len(rows) > 2 else ["(no A/B records in the raw file)"]
    return "\n".join(out) + "\n"


def put_section(path, text, heading):
    """Replaces the "## " section titled heading in path (up to the next "## " heading), or
    appends text at the end; the rest of the file stays byte for byte."""
    lines = open(path).read().splitlines(keepends=True) if os.path.exists(path) else []
    start = next((i for i, x in enumerate(lines) if x.rstrip("\n") == heading), None)
    if start is None:
        body = "".join(lines)
        if body and not body.endswith("\n"):
            body += "\n"
        new = body + ("\n" if body and not body.endswith("\n\n") else "") + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        new = "".join(lines[:start]) + text + ("\n" if end < len(lines) else "") \
            + "".join(lines[end:])
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw")
    ap.add_argument("--label", required=True)
    ap.add_argument("--baseline", required=True, help="what the baseline is (dir, commit)")
    ap.add_argument("--candidate", required=True, help="what the candidate is (dir, commit)")
    ap.add_argument("--command", default="")
    ap.add_argument("--harness", default="this checkout", help="where bench/run ran from")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--failed", default="", help="failed stages, for the record")
    ap.add_argument("--results", help="also put the section into this file (bench/RESULTS.md)")
    opts = ap.parse_args()
    text = section(opts)
    sys.stdout.write(text)
    if opts.results:
        put_section(opts.results, text, f"## A/B: {opts.label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
