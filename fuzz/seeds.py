#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): hand-picked inputs
taken from the code's own tests and docs. The committed files are what counts; this
script says where they come from and writes them again (`python3 fuzz/seeds.py`; the
backup files need the `zstd` program). Files named `found-*` are inputs the fuzzer found
that failed once (kept as reproducers of fixed bugs); this script leaves them alone.
scripts/fuzz.sh never changes fuzz/corpus."""
import hashlib
import json
import os
import struct
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- bucket_keys
# PATH_A [NUL PATH_B [NUL PARAMS]]; PARAMS: prefix length (u16 LE), refused byte.
def keys():
    t = "bucket_keys"
    put(t, "plain", "a/b.txt")
    put(t, "utf8", "é/日本")
    put(t, "not-utf8", b"a/\xff")
    put(t, "newline", "a/b\nc")
    put(t, "c1-control", "a/b\u0085c")
    put(t, "reserved", ".deskfs/x")
    put(t, "reserved-below", "x/.deskfs")
    put(t, "reserved-alone", ".deskfs")
    put(t, "empty-segment", "a//b")
    put(t, "dots", "./a/../b")
    put(t, "too-long", "a" * 1100)
    put(t, "long-with-prefix", b"a" * 1000 + b"\0\0" + struct.pack("<H", 30) + b"\0")
    put(t, "two-paths", b"src/main.rs\0src/lib.rs")
    put(t, "same-path", b"x/y\0x/y")
    put(t, "local-hash-digits", b"dir/part#12\0dir/part#x\0\0\0#")
    put(t, "max-prefix", b"docs/README.md\0docs\0" + struct.pack("<H", 512) + b"\0")


# ---------------------------------------------------------------- format_record
def fmt():
    t = "format_record"
    rec = {"format": "deskfs", "version": 1, "workspace": "work",
           "id": "5f0c6c2e8a7b4d1e9f3a2b1c0d4e5f60", "meta": "sqlite", "created": 1733356800}
    put(t, "sqlite", json.dumps(rec, separators=(",", ":")))
    put(t, "postgres", json.dumps(dict(rec, meta="postgres"), separators=(",", ":")))
    put(t, "pretty", json.dumps(rec, indent=2))
    put(t, "old-no-meta", json.dumps({"version": 1, "workspace": "w", "id": "00ff"}))
    put(t, "wrong-types", '{"id":7,"meta":null,"version":-1,"created":1.5,"x":[1]}')
    put(t, "duplicate-keys", '{"id":"a","id":"b"}')
    put(t, "not-object", "[\"deskfs\"]")
    put(t, "null", "null")
    put(t, "cut", json.dumps(rec)[:40])
    put(t, "empty", "")
    put(t, "escapes", '{"workspace":"\\u00e9\\n\\"","id":"\\ud83d\\ude00"}')


# ---------------------------------------------------------------- meta_backup
def u(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v == 0:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def i(v):
    return u(((v << 1) ^ (v >> 63)) & (2**64 - 1))


def byts(b):
    return u(len(b)) + b


def opt(b):
    return b"\0" if b is None else b"\1" + byts(b)


KIND = {"file": 0o10, "dir": 0o4, "symlink": 0o12, "fifo": 0o1}


def inode(ino, kind, perm=0o644, size=0, target=None, t=1_733_356_800_000_000_000):
    return (b"\1" + u(ino) + bytes([KIND[kind]]) + u(perm) + u(1000) + u(1000) + u(0) + u(1)
            + u(size) + i(t) + i(t) + i(t) + i(t) + u(1) + opt(target))


def dentry(parent, name, ino):
    return b"\3" + u(parent) + byts(name) + u(ino)


def obj(path, ino, kind="file", size=0, etag=b'"e1"'):
    return (b"\6" + byts(path) + byts(path) + u(ino) + bytes([KIND[kind]]) + u(1) + i(-1)
            + opt(etag) + u(size))


def backup(records, kind="snapshot", gen=1, frm=0, to=7, fmt_version=1):
    raw = b"".join(records)
    body = subprocess.run(["zstd", "-q", "-3", "-c"], input=raw, capture_output=True,
                          check=True).stdout
    head = json.dumps({"format": fmt_version, "kind": kind, "workspace": "5f0c6c2e",
                       "generation": gen, "from_seq": frm, "to_seq": to,
                       "records": len(records), "written_ns": 1733356800000000000,
                       "host": "h1"}, separators=(",", ":")).encode()
    out = b"DESKFSBK" + struct.pack("<I", len(head)) + head + struct.pack("<Q", len(raw)) + body
    return out + hashlib.sha256(out).digest()


def meta():
    t = "meta_backup"
    tree = [inode(1, "dir", 0o755), inode(2, "dir", 0o755), inode(3, "file", size=12),
            inode(4, "symlink", 0o777, 11, b"src/main.rs"), dentry(1, b"src", 2),
            dentry(2, b"main.rs", 3), dentry(2, b"copy.rs", 3), dentry(1, b"link", 4),
            b"\5" + u(3) + u(1) + byts(b"user.note") + byts(b"hi"),
            obj(b"src/main.rs", 3, size=12), obj(b"link", 4, "symlink", 11)]
    put(t, "snapshot", backup(tree))
    put(t, "delta", backup([b"\2" + u(4), b"\4" + u(1) + byts(b"link"), b"\7" + byts(b"link"),
                            inode(5, "fifo"), dentry(2, b"fifo", 5),
                            b"\5" + u(3) + u(0)], "delta", 1, 7, 12))
    # The codec's unit test records (extreme values).
    sample = [b"\1" + u(42) + bytes([0o12]) + u(0o7777) + u(2**32 - 1) + u(0) + u(0) + u(1)
              + u(3) + i(-5) + i(1_700_000_000_123_456_789) + i(-2**63) + i(2**63 - 1)
              + u(2**64 - 1) + opt(b"a\xffb"),
              b"\2" + u(7), dentry(1, b"\x01odd name\n", 42), b"\4" + u(1) + byts(b""),
              b"\5" + u(42) + u(2) + byts(b"user.a") + byts(b"\0\1\2") + byts(b"user.b") + byts(b""),
              b"\6" + byts(b"x/y") + byts(b".deskfs/escaped/ab") + u(42) + bytes([0o10]) + u(3)
              + i(-1) + opt(b'"e"') + u(9),
              b"\7" + byts(b"gone")]
    put(t, "sample-delta", backup(sample, "delta", 3, 10, 20))
    put(t, "empty-snapshot", backup([], to=0))
    put(t, "newer-format", backup(tree[:2], fmt_version=2))
    # Directories in a cycle, a directory with two names, an entry to a missing inode.
    put(t, "cycle", backup([inode(1, "dir"), inode(2, "dir"), inode(3, "dir"),
                            dentry(1, b"a", 2), dentry(2, b"b", 3), dentry(3, b"up", 2),
                            dentry(1, b"again", 3), dentry(3, b"ghost", 9)]))
    put(t, "key-snapshot", ".deskfs/meta/g0000000007/snapshot.dbk")
    put(t, "key-delta", ".deskfs/meta/g0000000007/d0000000000000123.dbk")
    put(t, "key-other", ".deskfs/meta/g1/other")
    put(t, "key-format", ".deskfs/format.json")


# ---------------------------------------------------------------- agents_manual
BEGIN_LINE = ("<!-- deskfs:manual:begin (machine part: written by `deskfs manual record`, "
              "checked by `deskfs manual check`; keep the markers) -->")
END = "<!-- deskfs:manual:end -->"


def block(body):
    return f"{BEGIN_LINE}\n```toml\n{body}```\n{END}"


def template(agent, body="# no tools or repos recorded yet\n"):
    return f"""# Desk manual: {agent}

This is the desk's manual, the first thing a session reads (`deskfs resume {agent}`).
Keep it true: what is installed and how, how to build and test each repo, quirks worth
remembering. Edit this part freely; leave the block between the deskfs:manual markers to
`deskfs manual record` (tools) and `deskfs manual repo` (repo build/test commands).

## Layout
- `repos/NAME/`: long-lived clones. `tasks/TASK/`: one git worktree per task
  (`deskfs task start {agent} TASK --repo NAME`, `deskfs task finish {agent} TASK`).
- `notes/`: notes to the next session. `tools/bin/`: the desk's tools (on PATH in exec).
- `.cache/`: cargo, npm, pip and uv caches. `tmp/`: scratch (`deskfs desk tidy` cleans it).

## Gotchas
- (none yet)

{block(body)}
"""


def manual():
    t = "agents_manual"
    recorded = ('[[tool]]\nname = "rg"\nversion = "ripgrep 14.1.0"\nversion_cmd = "rg --version"\n'
                'recorded = "2026-12-04T10:00:00Z"\n\n[[repo]]\nname = "app"\n'
                'test_cmd = "cargo test"\nbuild_cmd = "cargo build"\n')
    put(t, "template", template("alice"))
    put(t, "recorded", template("alice", recorded))
    put(t, "crlf-prose", "x\r\n  trailing  \n" + block(recorded) + "\nafter\n\n\tend")
    put(t, "prose-only", "just prose")
    put(t, "begin-without-end", f"a\n{BEGIN_LINE}\n```toml\n```\n")
    put(t, "end-without-begin", f"a\n{END}\n")
    put(t, "no-fence", f"<!-- deskfs:manual:begin -->\nno fence\n{END}\n")
    put(t, "bad-toml", f"<!-- deskfs:manual:begin -->\n```toml\n[[tool]]\nname=1\n```\n{END}\n")
    put(t, "unknown-keys", template("bob", '[[tool]]\nname = "jq"\nversion = "jq-1.7"\n'
                                          'version_cmd = "jq --version"\nextra = true\n'
                                          '[other]\nx = 1\n'))
    put(t, "two-blocks", template("c") + "\n" + block("[[repo]]\nname = \"x\"\n") + "\n")
    put(t, "empty-body", f"{BEGIN_LINE}\n```toml\n```\n{END} tail on the end line\n")


# ---------------------------------------------------------------- path_confine
def confine():
    t = "path_confine"
    put(t, "read-inside-and-out", "read a/b/file\nread out/outside-secret-7f3a\nls out\nstat out/dir\n")
    put(t, "link-up", "ln . up ..\nread up/outside/outside-secret-7f3a\nls up\nwrite up/x\n")
    put(t, "link-absolute", "ln a/b abs /etc/passwd\nread a/b/abs\nwrite a/b/abs\nls a/b/abs\n")
    put(t, "link-into-state", "ln . s .desk/journal\nwrite s\nwrite -x state/journal\nrm s\nread s\n")
    put(t, "change-state", "mkdir -p state/new\nmv a state/a\nmv -f notes .desk\nrm -r state/tasks\n"
                           "rm -r .desk\nwrite ./.desk/journal\n")
    put(t, "write-rename", "write -n notes/n.md\nwrite -x notes/n.md\nmv notes/n.md a/n.md\n"
                           "rm a/n.md\nmkdir -p a/b/c/d\nrm -r a\n")
    put(t, "loops", "ln notes loop loop\nread notes/loop\nln . deep a/b/../../..\n"
                    "read deep/outside/outside-secret-7f3a\n")
    put(t, "deep-link-out", "ln a/b up2 ../../../outside\nread a/b/up2/outside-secret-7f3a\n"
                            "mkdir a/b/up2/new\nwrite a/b/up2/new2\nmv a/b/up2 notes/up2\n")
    put(t, "link-to-state-dir", "ln notes st ../.desk\nwrite notes/st/tasks/t.json\n"
                                "mkdir -p notes/st/x\nmv -f a/b/file notes/st/journal\nrm -r notes/st/tasks\n")
    put(t, "no-links", "nolinks\nln . f a/b/file\nread f\nread a/b/file\nln a l b\nread a/l/file\n"
                       "write f\nls a/l\n")
    put(t, "text", "link a/b\t../../..\nlink a\t../x\nlink \t.\n/abs/path\n../up\na/./b//c\n"
                   ".desk/journal\n" + "n" * 256 + "\n" + "d/" * 2049 + "\n")


if __name__ == "__main__":
    keys()
    fmt()
    meta()
    manual()
    confine()
    n = sum(len(f) for _, _, f in os.walk(ROOT))
    print(f"{n} seed files under {ROOT}")
