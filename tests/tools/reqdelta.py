#!/usr/bin/env python3
"""reqdelta.py BEFORE.json AFTER.json — one line: the kernel requests a mount daemon
served between two `deskfs status --json` snapshots, the kinds that took the most daemon
time first: `op count x mean-us (round trips)`, and the total. For test logs: where a
slow case spent its time."""
import json
import sys


def requests(path):
    try:
        with open(path) as f:
            j = json.load(f)
    except (OSError, ValueError):
        return {}
    rows = find(j) or []
    return {r["op"]: r for r in rows if isinstance(r, dict) and "op" in r}


def find(o):
    """The first `requests` list in the status (a mount's, under `mounts`)."""
    if isinstance(o, dict):
        if isinstance(o.get("requests"), list):
            return o["requests"]
        o = list(o.values())
    if isinstance(o, list):
        for v in o:
            r = find(v)
            if r:
                return r
    return None


def main():
    if len(sys.argv) != 3:
        print("usage: reqdelta.py BEFORE.json AFTER.json", file=sys.stderr)
        return 2
    a, b = requests(sys.argv[1]), requests(sys.argv[2])
    rows = []
    for op, r in b.items():
        p = a.get(op, {})
        n = r.get("count", 0) - p.get("count", 0)
        ns = r.get("total_ns", 0) - p.get("total_ns", 0)
        rt = r.get("round_trips", 0) - p.get("round_trips", 0)
        if n > 0:
            rows.append((ns, op, n, rt))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) / 1e9
    parts = [f"{op} {n}x{ns / n / 1e3:.0f}us ({rt} rt)" for ns, op, n, rt in rows[:8]]
    print(f"requests: {total:.1f} s in the daemon; " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
