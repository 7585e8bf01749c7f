#!/usr/bin/env python3
"""treesnap.py DIR > MANIFEST: every entry below DIR with everything POSIX says about it.

One line per entry, sorted by path (paths as escaped bytes, so odd names compare exactly):
  path  type  mode(octal, with setuid/setgid/sticky)  uid  gid  size  mtime_ns
  content(sha256 | symlink target | -)  link(first path of the same inode, or -)  xattrs
Atimes and ctimes are left out (reading changes the one, a rebuild the other); directory
sizes too (they are the file system's own). Used by 95-lose-the-machine to compare a
workspace before the machine is lost and after it was rebuilt from the bucket.
"""
import hashlib
import os
import stat
import sys


def esc(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace").replace("\n", "\\n").replace("\t", "\\t")


def main() -> None:
    root = os.fsencode(sys.argv[1])
    rows = []
    first_path = {}
    for dp, dns, fns in os.walk(root):
        dns.sort()  # a fixed walk order: hard-link columns name the same first path
        for n in dns + sorted(fns):
            p = os.path.join(dp, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            kind = {
                stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l",
                stat.S_IFIFO: "p", stat.S_IFSOCK: "s", stat.S_IFCHR: "c", stat.S_IFBLK: "b",
            }.get(stat.S_IFMT(st.st_mode), "?")
            if kind == "f":
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for b in iter(lambda: f.read(1 << 20), b""):
                        h.update(b)
                content = h.hexdigest()
            elif kind == "l":
                content = "->" + esc(os.readlink(p))
            else:
                content = "-"
            link = "-"
            if kind != "d" and st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                link = esc(first_path.setdefault(key, rel))
            try:
                names = sorted(os.listxattr(p, follow_symlinks=False))
                xa = ",".join(
                    f"{x}={os.getxattr(p, x, follow_symlinks=False).hex()}" for x in names)
            except OSError:
                xa = "?"
            rows.append((rel, "\t".join([
                esc(rel), kind, f"{stat.S_IMODE(st.st_mode):o}", str(st.st_uid),
                str(st.st_gid), str(st.st_size) if kind != "d" else "-",
                str(st.st_mtime_ns), content, link, xa or "-"])))
    rows.sort()
    out = [line for _, line in rows]
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
