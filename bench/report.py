#!/usr/bin/env python3
"""Tables and chart for the deskfs benchmark.

    report.py RESULTS.json [--png OUT.png]     reprint the table (and redraw the chart)

Ratios are of the raw figures: floor ÷ local (when the floor target ran: what FUSE itself
costs here), deskfs ÷ local and peer ÷ deskfs (juicefs, rclone, s3fs). For rows marked ↑
(ops/s, MiB/s, IOPS) bigger is better; for rows marked ↓ (seconds, ms, MiB of RSS)
smaller is better.
"""
import json
import os
import sys

# (workload, metric, label, better: "up" | "down"); {..} is filled from the sizes
ROWS = [
    ("smallfiles", "create", "small files {SMALL_N}×4 KiB: create", "up"),
    ("smallfiles", "stat", "small files: stat (cold)", "up"),
    ("smallfiles", "read", "small files: read", "up"),
    ("smallfiles", "delete", "small files: delete", "up"),
    ("untar", "untar", "untar {tree_files} files ({tree_mib} MiB)", "down"),
    ("untar", "find", "find | wc -l of the tree (cold)", "down"),
    ("untar", "rm_rf", "rm -rf of the tree", "down"),
    ("git", "clone", "git clone ({tree_files} files, {GIT_COMMITS}+1 commits)", "down"),
    ("git", "status", "git status (cold)", "down"),
    ("git", "log", "git log --stat", "down"),
    ("git", "commit", "edit 10 files + git add -A + commit", "down"),
    ("cargo", "build", "cargo build ({crate}), target dir on the mount", "down"),
    ("cargo", "rebuild", "cargo build after touching lib.rs", "down"),
    ("npm", "install", "npm-style install ({NPM_PKGS} pkgs: stage, rename, .bin links)", "down"),
    ("npm", "resolve", "read every package.json + .bin link (cold)", "down"),
    ("npm", "rm_rf", "rm -rf node_modules", "down"),
    ("lsdir", "create_empty", "create {LSDIR_N} empty files in one dir", "up"),
    ("lsdir", "ls_l_cold", "ls -l of the {LSDIR_N}-entry dir (cold)", "down"),
    ("lsdir", "ls_l_warm", "ls -l again (warm)", "down"),
    ("sqlite", "insert_tx", "sqlite one-row transactions ({SQLITE_TX})", "up"),
    ("seq", "write", "seq write {SEQ_MB} MiB + fsync", "up"),
    ("seq", "upload_settle", "…then until the object is complete in the bucket", "down"),
    ("seq", "remount", "unmount + mount with an empty cache", "down"),
    ("seq", "ttfb_small", "time to first byte, cold 4 KiB file (median of 5)", "down"),
    ("seq", "ttfb_big", "time to first byte, cold, {SEQ_MB} MiB file", "down"),
    ("seq", "read_cold", "seq read after remount (empty cache)", "up"),
    ("seq", "read_warm", "seq read again (warm)", "up"),
    ("seq", "read_warm_later", "seq read again, 10 s later", "up"),
    ("fio", "randwrite", "fio 4 KiB randwrite, {FIO_MB} MiB file, {FIO_SECONDS} s", "up"),
    ("fio", "randread", "fio 4 KiB randread after remount (cold)", "up"),
    ("durable", "create_close_local", "create+close 4 KiB ({DURABLE_N}), --durability local", "up"),
    ("durable", "create_close_bucket", "create+close 4 KiB, --durability bucket", "up"),
    ("durable", "fsync_local", "4 KiB rewrite + fsync, --durability local", "up"),
    ("durable", "fsync_bucket", "4 KiB rewrite + fsync, --durability bucket", "up"),
    ("scale", "create", "scale: create {SCALE_N} empty files ({SCALE_WORKERS} processes), overall", "up"),
]
for _tag, _n in (("1k", "1k"), ("100k", "100k"), ("n", "{SCALE_N}")):
    ROWS += [
        ("scale", f"create_{_tag}", f"scale: create rate, files up to {_n}", "up"),
        ("scale", f"umount_{_tag}", f"scale @{_n} files: unmount", "down"),
        ("scale", f"mount_{_tag}", f"scale @{_n}: mount until the root answers stat", "down"),
        ("scale", f"stat_cold_p50_{_tag}", f"scale @{_n}: stat cold (drop_caches), median", "down"),
        ("scale", f"stat_cold_p99_{_tag}", f"scale @{_n}: stat cold, p99", "down"),
        ("scale", f"stat_warm_p50_{_tag}", f"scale @{_n}: stat warm, median", "down"),
        ("scale", f"stat_warm_p99_{_tag}", f"scale @{_n}: stat warm, p99", "down"),
        ("scale", f"create_us_{_tag}", f"scale @{_n}: create+close, mean ({{SCALE_OPS}} ops)", "down"),
        ("scale", f"unlink_us_{_tag}", f"scale @{_n}: unlink, mean", "down"),
    ]
ROWS += [
    ("scale", "ls_l_cold", "scale: ls -l of the {SCALE_LS_N}-entry dir (cold)", "down"),
    ("scale", "ls_l_warm", "scale: ls -l again (warm)", "down"),
    ("scale", "peak_rss", "scale: mount daemon peak RSS (VmHWM) with the tree", "down"),
    ("daemon", "peak_rss", "mount daemon peak RSS (VmHWM)", "down"),
]
ORDER = ["local", "floor", "floor-pt", "deskfs", "juicefs", "rclone", "s3fs"]
FLOORS = ["floor", "floor-pt"]
PEERS = ["juicefs", "rclone", "s3fs"]


def no_chart(m):
    return (m in {"upload_settle", "remount", "peak_rss"} or m.startswith(("umount_", "mount_"))
            or "_p99_" in m or m.startswith("stat_warm"))


def index(results):
    data, status = {}, {}
    for r in results["records"]:
        if r["metric"] == "_status":
            status[(r["target"], r["workload"])] = r["value"]
        elif r["metric"].startswith("_"):
            continue
        else:
            data[(r["target"], r["workload"], r["metric"])] = r
    targets = sorted(results["targets"], key=lambda t: ORDER.index(t) if t in ORDER else 99)
    return data, status, targets


def label(results, text):
    s = dict(results.get("sizes", {}))
    tree = results.get("inputs", {}).get("tree", {})
    s.update(tree_files=tree.get("files", "?"), tree_mib=round(tree.get("bytes", 0) / 2 ** 20, 1),
             crate=results.get("inputs", {}).get("crate", "crate"))
    try:
        return text.format(**s)
    except (KeyError, IndexError):
        return text


def num(v):
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, (int, float)):
        return str(v)
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def cell(data, status, t, w, m, results):
    r = data.get((t, w, m))
    st = status.get((t, w))
    if t not in results["targets"] or not results["targets"][t].get("mounted"):
        return "n/a"
    if r is None:
        if st and st != "ok":
            return st
        return "–"
    v = r.get("value")
    if r.get("rc") == "timeout":
        s = "timeout"
    elif r.get("rc") not in (None, 0):
        s = f"fail (rc={r['rc']})"
    elif v is None:
        s = "fail"
    else:
        s = num(v)
    if r.get("partial"):
        s += f" (partial n={r.get('n', r.get('packages'))})"
    if r.get("errors"):
        s += f" ({r['errors']} errors)"
    if r.get("short_of"):
        s += f" (at {r.get('files'):,} files)"
    if r.get("check") is False:
        s += " (check failed)"
    if st == "timeout":
        s += " (workload timed out)"
    return s


def ratio(data, a, b, w, m):
    ra, rb = data.get((a, w, m)), data.get((b, w, m))
    if not ra or not rb:
        return "–"
    if any(r.get("rc") not in (None, 0) for r in (ra, rb)):
        return "–"
    va, vb = ra.get("value"), rb.get("value")
    if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)) or isinstance(va, bool) or not vb:
        return "–"
    x = va / vb
    return f"{x:.2f}" if x < 10 else f"{x:.0f}" if x < 1000 else f"{x:,.0f}"


def rows(results):
    data, status, targets = index(results)
    pairs = [(f, "local") for f in FLOORS if f in targets and "local" in targets]
    if "deskfs" in targets and "local" in targets:
        pairs.append(("deskfs", "local"))
    for p in PEERS:
        if p in targets and "deskfs" in targets:
            pairs.append((p, "deskfs"))
    header = ["workload", "unit"] + targets + [f"{a}÷{b}" for a, b in pairs]
    out = []
    for w, m, text, better in ROWS:
        # a row shows when some target has the figure, or when the workload failed somewhere
        if not any((t, w, m) in data or status.get((t, w), "ok") != "ok" for t in targets):
            continue
        if not any((t, w) in status or (t, w, m) in data for t in targets):
            continue
        unit = ""
        for t in targets:
            if (t, w, m) in data:
                unit = data[(t, w, m)].get("unit", "")
                break
        arrow = "↑" if better == "up" else "↓"
        out.append([label(results, text), f"{unit} {arrow}"]
                   + [cell(data, status, t, w, m, results) for t in targets]
                   + [ratio(data, a, b, w, m) for a, b in pairs])
    return header, out


def header_lines(results):
    mc = results["machine"]
    lines = [f"date: {results['date']}  mode: {results['mode']}  total: {results.get('total_seconds')} s",
             f"machine: {mc['nproc']} CPUs ({mc['cpu']}), {mc['mem_gib']} GiB RAM, kernel {mc['kernel']}, "
             f"state dir on {mc['state_disk']}, drop_caches {'yes' if mc['drop_caches'] else 'no (not root)'}",
             f"S3: {results['s3'].get('endpoint')} bucket {results['s3'].get('bucket')} "
             f"({results['tools'].get('s3_server') or 'server version unknown'})"]
    for t, info in results["targets"].items():
        extra = "" if info.get("mounted") else f"  NOT RUN: {info.get('error', '')}"
        lines.append(f"{t}: {info.get('version')}"
                     + (f"  [{info['seconds']} s]" if info.get("seconds") is not None else "") + extra)
    for t, why_not in (results.get("not_run") or {}).items():
        lines.append(f"{t}: not run ({why_not})")
    lines.append("tools: " + ", ".join(f"{k} {v}" for k, v in results["tools"].items() if v and k != "s3_server"))
    return lines


def text_table(results):
    header, body = rows(results)
    w = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    out = header_lines(results) + ["", fmt(header), "  ".join("-" * x for x in w)]
    out += [fmt(r) for r in body]
    out += ["", "ratios are of the raw figures; ↑ bigger is better, ↓ smaller is better"]
    for t, title in [("deskfs", "Where the time goes (deskfs): FUSE requests per workload (deskfs status --json)")] + \
            [(f, f"FUSE requests on the {f} target per workload (deskfs-floorfs --stats)") for f in FLOORS]:
        wh, wb = why_rows(results, t)
        if wb:
            w = [max(len(str(r[i])) for r in [wh] + wb) for i in range(len(wh))]
            out += ["", title, fmt(wh), "  ".join("-" * x for x in w)] + [fmt(r) for r in wb]
    return "\n".join(out)


def markdown(results):
    header, body = rows(results)
    md = [f"# deskfs benchmark ({results['mode']} run, {results['date']})", ""]
    md += [f"- {x}" for x in header_lines(results)]
    md += ["", "Ratios are of the raw figures (floor ÷ local, deskfs ÷ local, peer ÷ deskfs): on ↑ rows bigger is",
           "better, on ↓ rows smaller is better. `partial n=…`: the phase hit its time cap after n operations;",
           "`check failed`: the workload's own check of its result failed.", ""]
    md.append("| " + " | ".join(header) + " |")
    md.append("|" + "---|" + "---|" + "---:|" * (len(header) - 2))
    for r in body:
        md.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    sz = results.get("sizes", {})
    md += ["", "Sizes: " + ", ".join(f"{k}={v}" for k, v in sz.items()),
           f"Tree: first {results['inputs']['tree'].get('files')} files of {results['inputs']['tree'].get('src')}; "
           f"crate: {results['inputs'].get('crate')} (offline, no dependencies).", ""]
    wh, wb = why_rows(results)
    if wb:
        md += ["## Where the time goes (deskfs)", "",
               "Per workload, from the `requests` of `deskfs status --json` read before and after it (summed over",
               "the daemons of a workload that remounts): the FUSE requests the daemon served, per file the",
               "workload made, and the daemon's time (handler start to reply) per request of the kinds that took",
               "most of it, with the metadata round trips per request (RT) and the kind's share of the daemon's",
               "time; wall s is the workload's own wall time (setup and cleanup included). "
               + ("The last columns: the requests per file of the floor target(s) (deskfs-floorfs, the same kinds"
                  " counted) and JuiceFS's own counters (its `.stats`) for the same workload, when they ran."), ""]
        md.append("| " + " | ".join(wh) + " |")
        md.append("|---|" + "---:|" * 5 + "---|" + "---:|" * (len(wh) - 7))
        for r in wb:
            md.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
        md.append("")
    for f in FLOORS:
        wh, wb = why_rows(results, f)
        if not wb:
            continue
        md += [f"## FUSE requests on the floor ({f})", "",
               "The same counts for deskfs-floorfs (`--stats`: SIGUSR1 before and after each workload): the",
               "requests any FUSE file system with deskfs's kernel settings gets for the workload, and the",
               "floor daemon's time per request (its lock, its in-memory work and the reply's write to",
               "/dev/fuse). `forget` is not counted (deskfs does not count it either).", ""]
        md.append("| " + " | ".join(wh) + " |")
        md.append("|---|" + "---:|" * 5 + "---|")
        for r in wb:
            md.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
        md.append("")
    png = f"bench-{results['mode']}.png"
    md += [f"![chart]({png})", ""]
    return "\n".join(md)


def why(results, top=5):
    """Per target and workload with request counters (`_requests` records): files, requests,
    requests per file, daemon seconds, and per kind (by time, largest first) count, per file,
    µs per request, round trips per request."""
    out = {}
    walls = {(r["target"], r["workload"]): r.get("value") for r in results["records"] if r["metric"] == "wall"}
    for r in results["records"]:
        if r["metric"] != "_requests" or not isinstance(r.get("value"), dict):
            continue
        files = r.get("files") or None
        req = r["value"]
        n = sum(v[0] for v in req.values())
        ns = sum(v[1] for v in req.values())
        kinds = []
        for op, (c, t, rt) in sorted(req.items(), key=lambda kv: -kv[1][1])[:top]:
            kinds.append({"op": op, "count": c, "per_file": round(c / files, 2) if files else None,
                          "us_per_request": round(t / c / 1000, 1) if c else None,
                          "rt_per_request": round(rt / c, 2) if c else None, "share": round(t / ns, 3) if ns else None})
        out.setdefault(r["target"], {})[r["workload"]] = {
            "files": files, "requests": n, "per_file": round(n / files, 2) if files else None,
            "wall_s": walls.get((r["target"], r["workload"])),
            "daemon_s": round(ns / 1e9, 3), "us_per_request": round(ns / n / 1000, 1) if n else None, "top": kinds}
    return out


def why_rows(results, target="deskfs"):
    """The "where the time goes" table of `target` (deskfs, or a floor); deskfs's has the
    floor's and JuiceFS's requests per file beside, when they ran."""
    w = why(results)
    d = w.get(target) or {}
    others = [t for t in FLOORS + ["juicefs"] if target == "deskfs" and w.get(t)]
    order = [x[0] for x in ROWS]
    head = ["workload", "files", "requests", "per file", "wall s", "daemon s",
            "top kinds: per file (or count) · µs/request · RT/request · share of daemon time"]
    head += [f"{t} req/file" for t in others]
    body = []
    for wl in sorted(d, key=lambda x: order.index(x) if x in order else 99):
        x = d[wl]
        kinds = "; ".join(
            f"{k['op']} {num(k['per_file']) + '/file' if k['per_file'] is not None else format(k['count'], ',')}"
            f" · {num(k['us_per_request'])} µs" + (f" · {num(k['rt_per_request'])} RT" if k["rt_per_request"] else "")
            + (f" · {k['share']:.0%}" if k.get("share") is not None else "")
            for k in x["top"])
        row = [wl, num(x["files"]) if x["files"] else "–", f"{x['requests']:,}",
               num(x["per_file"]) if x["per_file"] is not None else "–", num(x["wall_s"]) if x.get("wall_s") else "–",
               num(x["daemon_s"]), kinds]
        for t in others:
            ox = w[t].get(wl) or {}
            row.append(num(ox["per_file"]) if ox.get("per_file") is not None else "–")
        body.append(row)
    return head, body


def chart(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    data, status, targets = index(results)
    ref = "local" if "local" in targets else (targets[0] if targets else None)
    if ref is None:
        return None
    labels, series = [], {t: [] for t in targets}
    for w, m, text, better in ROWS:
        if no_chart(m):
            continue
        rr = data.get((ref, w, m))
        if not rr or rr.get("rc") not in (None, 0) or not isinstance(rr.get("value"), (int, float)) or not rr["value"]:
            continue
        labels.append(label(results, text))
        for t in targets:
            r = data.get((t, w, m))
            v = r.get("value") if r and r.get("rc") in (None, 0) else None
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v:
                series[t].append(None)
                continue
            series[t].append(v / rr["value"] if better == "up" else rr["value"] / v)
    if not labels:
        return None
    colors = {"local": "#7f7f7f", "floor": "#d62728", "floor-pt": "#e377c2", "deskfs": "#1f77b4", "juicefs": "#9467bd", "rclone": "#ff7f0e", "s3fs": "#2ca02c"}
    if len(targets) > 1:  # the reference is the line at 1
        targets = [t for t in targets if t != ref]
    n = len(targets)
    h = 0.8 / n
    fig, ax = plt.subplots(figsize=(12, 0.3 * len(labels) * max(n, 1.5) / 1.5 + 2.2))
    ys = list(range(len(labels)))
    for i, t in enumerate(targets):
        vals = series[t]
        pos = [y - 0.4 + h * (i + 0.5) for y in ys]
        ax.barh([p for p, v in zip(pos, vals) if v], [v for v in vals if v], height=h,
                color=colors.get(t), label=t)
        for p, v in zip(pos, vals):
            if v is None:
                ax.text(1e-4 * 1.1, p, "n/a / failed", va="center", fontsize=6, color=colors.get(t))
            else:
                ax.text(v * 1.08, p, f"{v:.2g}", va="center", fontsize=6)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(1e-4, 30)
    ax.axvline(1, color="black", linewidth=1.2)
    ax.text(1.05, -0.9, f"{ref} = 1", fontsize=8)
    ax.set_xlabel(f"speed relative to {ref} (log scale; >1 faster, <1 slower)")
    mc = results["machine"]
    ax.set_title(f"deskfs benchmark, {results['mode']} run, {results['date']}\n"
                 f"{mc['nproc']} CPUs, {mc['mem_gib']} GiB, kernel {mc['kernel']}; S3 = Garage on 127.0.0.1",
                 fontsize=10)
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main():
    res = json.load(open(sys.argv[1]))
    print(text_table(res))
    if "--png" in sys.argv:
        p = chart(res, sys.argv[sys.argv.index("--png") + 1])
        print(f"chart: {p}" if p else "no chart (matplotlib missing)", file=sys.stderr)
    if "--md" in sys.argv:
        open(sys.argv[sys.argv.index("--md") + 1], "w").write(markdown(res))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
