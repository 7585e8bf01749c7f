#!/usr/bin/env python3
"""azblob.py - a tiny Azure Blob client (python3 stdlib only, SharedKey auth) used by the e2e
tests to look at a container *without* going through deskfs (nor object_store), key by key.

    azblob.py ls PREFIX          every blob under PREFIX (no delimiter): "<size>\t<key>" per line
    azblob.py get KEY            blob body to stdout (exit 2 if missing)
    azblob.py head KEY           status line + response headers (x-ms-meta-*), exit 2 if missing
    azblob.py put KEY FILE|- [NAME=VALUE...]
                                 upload a file as one block blob (FILE '-' = stdin), with
                                 the user metadata x-ms-meta-NAME: VALUE
    azblob.py rm KEY             delete one blob
    azblob.py put-tree DIR PREFIX
                                 every file below DIR as the blob PREFIX/relpath (16 at a
                                 time, one process: a thousand files in seconds)

Connection settings come from the environment, as printed by scripts/azurite.sh:
AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_ENDPOINT
(http://HOST:PORT/ACCOUNT, path-style), AZURITE_CONTAINER.
"""
import base64
import concurrent.futures
import hashlib
import hmac
import http.client
import os
import sys
import urllib.parse
import xml.etree.ElementTree as ET
from email.utils import formatdate

VERSION = "2021-12-02"


def env(name):
    v = os.environ.get(name)
    if not v:
        sys.exit(f"azblob.py: {name} is not set")
    return v


ACCOUNT = env("AZURE_STORAGE_ACCOUNT_NAME")
KEY = base64.b64decode(env("AZURE_STORAGE_ACCOUNT_KEY"))
ENDPOINT = urllib.parse.urlsplit(env("AZURE_STORAGE_ENDPOINT"))
CONTAINER = env("AZURITE_CONTAINER")


def request(method, key, query=None, body=b"", headers=None):
    """One signed request; returns (status, headers dict lower-case, body)."""
    query = dict(query or {})
    path = ENDPOINT.path.rstrip("/") + "/" + CONTAINER
    if key is not None:
        path += "/" + urllib.parse.quote(key, safe="/~")
    hdrs = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": VERSION}
    hdrs.update(headers or {})
    length = str(len(body)) if body else ""
    ctype = hdrs.get("Content-Type", "")
    xms = "".join(f"{k.lower()}:{v}\n" for k, v in sorted(hdrs.items(), key=lambda kv: kv[0].lower()) if k.lower().startswith("x-ms-"))
    canon_res = f"/{ACCOUNT}{path}"  # Azurite signs the path as sent (percent-encoded)
    for k in sorted(query):
        canon_res += f"\n{k.lower()}:{query[k]}"
    to_sign = "\n".join([method, "", "", length, "", ctype, "", "", "", "", "", ""]) + "\n" + xms + canon_res
    sig = base64.b64encode(hmac.new(KEY, to_sign.encode(), hashlib.sha256).digest()).decode()
    hdrs["Authorization"] = f"SharedKey {ACCOUNT}:{sig}"
    if method in ("PUT", "POST") or body:
        hdrs["Content-Length"] = str(len(body))
    url = path + ("?" + urllib.parse.urlencode(query) if query else "")
    conn = http.client.HTTPConnection(ENDPOINT.hostname, ENDPOINT.port, timeout=120)
    conn.request(method, url, body=body or None, headers=hdrs)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def die_status(what, st, data):
    sys.exit(f"azblob.py: {what}: HTTP {st}: {data[:300]!r}")


def put(key, body, meta=()):
    hdrs = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
    for kv in meta:
        k, _, v = kv.partition("=")
        hdrs[f"x-ms-meta-{k}"] = v
    st, _, data = request("PUT", key, body=body, headers=hdrs)
    if st != 201:
        die_status(f"put {key}", st, data)


def tree(root):
    """(relpath, path) of every file below root, sorted."""
    out = []
    for dp, _, fns in os.walk(root):
        for n in fns:
            p = os.path.join(dp, n)
            out.append((os.path.relpath(p, root), p))
    return sorted(out)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "ls":
        marker = ""
        while True:
            q = {"restype": "container", "comp": "list", "prefix": arg}
            if marker:
                q["marker"] = marker
            st, _, data = request("GET", None, q)
            if st != 200:
                die_status("list", st, data)
            root = ET.fromstring(data)
            for b in root.iter("Blob"):
                name = b.findtext("Name")
                size = b.findtext("Properties/Content-Length")
                print(f"{size}\t{name}")
            marker = root.findtext("NextMarker") or ""
            if not marker:
                break
    elif cmd in ("get", "head"):
        st, h, data = request("GET" if cmd == "get" else "HEAD", arg)
        if st == 404:
            sys.exit(2)
        if st != 200:
            die_status(cmd, st, data)
        if cmd == "get":
            sys.stdout.buffer.write(data)
        else:
            print(f"HTTP {st}")
            for k, v in sorted(h.items()):
                print(f"{k}: {v}")
    elif cmd == "put":
        src = sys.argv[3]
        body = sys.stdin.buffer.read() if src == "-" else open(src, "rb").read()
        put(arg, body, sys.argv[4:])
    elif cmd == "put-tree":
        prefix = sys.argv[3].rstrip("/")

        def one(item):
            with open(item[1], "rb") as f:
                put(f"{prefix}/{item[0]}", f.read())

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(ex.map(one, tree(arg)))
    elif cmd == "rm":
        st, _, data = request("DELETE", arg)
        if st not in (202, 404):
            die_status("rm", st, data)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
