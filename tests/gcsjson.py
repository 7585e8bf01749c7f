#!/usr/bin/env python3
"""gcsjson.py - a tiny GCS JSON-API client (python3 stdlib only) used by the e2e tests to look
at a bucket in fake-gcs-server *without* going through deskfs, object_store or the XML shim.

    gcsjson.py ls PREFIX           every object under PREFIX: "<size>\t<key>" per line
    gcsjson.py get KEY             object body to stdout (exit 2 if missing)
    gcsjson.py meta KEY            the object's user metadata, "name=value" per line (exit 2 if missing)
    gcsjson.py put KEY FILE|- [NAME=VALUE...]   upload with user metadata (multipart upload)
    gcsjson.py put-tree DIR PREFIX every file below DIR as the object PREFIX/relpath (16 at a
                                   time, one process)

Settings from the environment, as printed by scripts/gcs-server.sh: GCS_EMULATOR_URL
(http://127.0.0.1:PORT, the emulator's JSON API), GCS_BUCKET.
"""
import concurrent.futures
import http.client
import json
import os
import sys
import urllib.parse
import uuid


def env(name):
    v = os.environ.get(name)
    if not v:
        sys.exit(f"gcsjson.py: {name} is not set")
    return v


URL = urllib.parse.urlsplit(env("GCS_EMULATOR_URL"))
BUCKET = env("GCS_BUCKET")


def q(s):
    return urllib.parse.quote(s, safe="")


def request(method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=120)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def obj(key):
    st, data = request("GET", f"/storage/v1/b/{q(BUCKET)}/o/{q(key)}")
    if st == 404:
        sys.exit(2)
    if st != 200:
        sys.exit(f"gcsjson.py: GET {key}: HTTP {st}: {data[:300]!r}")
    return json.loads(data)


def put(key, data, meta=None):
    b = "b" + uuid.uuid4().hex
    o = {"name": key}
    if meta:
        o["metadata"] = meta
    body = (f"--{b}\r\nContent-Type: application/json\r\n\r\n{json.dumps(o)}\r\n"
            f"--{b}\r\nContent-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{b}--\r\n".encode()
    st, resp = request("POST", f"/upload/storage/v1/b/{q(BUCKET)}/o?uploadType=multipart", body,
                       {"Content-Type": f"multipart/related; boundary={b}"})
    if st != 200:
        sys.exit(f"gcsjson.py: put {key}: HTTP {st}: {resp[:300]!r}")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "ls":
        token = ""
        while True:
            qs = {"prefix": arg, "maxResults": "1000"}
            if token:
                qs["pageToken"] = token
            st, data = request("GET", f"/storage/v1/b/{q(BUCKET)}/o?" + urllib.parse.urlencode(qs))
            if st != 200:
                sys.exit(f"gcsjson.py: list {arg}: HTTP {st}: {data[:300]!r}")
            page = json.loads(data)
            for o in page.get("items", []):
                print(f"{o['size']}\t{o['name']}")
            token = page.get("nextPageToken")
            if not token:
                break
    elif cmd == "get":
        obj(arg)
        st, data = request("GET", f"/storage/v1/b/{q(BUCKET)}/o/{q(arg)}?alt=media")
        if st != 200:
            sys.exit(f"gcsjson.py: get {arg}: HTTP {st}")
        sys.stdout.buffer.write(data)
    elif cmd == "meta":
        for k, v in sorted((obj(arg).get("metadata") or {}).items()):
            print(f"{k}={v}")
    elif cmd == "put":
        src = sys.argv[3]
        data = sys.stdin.buffer.read() if src == "-" else open(src, "rb").read()
        put(arg, data, dict(a.split("=", 1) for a in sys.argv[4:]))
    elif cmd == "put-tree":
        prefix = sys.argv[3].rstrip("/")
        files = []
        for dp, _, fns in os.walk(arg):
            for n in fns:
                p = os.path.join(dp, n)
                files.append((os.path.relpath(p, arg), p))

        def one(item):
            with open(item[1], "rb") as f:
                put(f"{prefix}/{item[0]}", f.read())

        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(ex.map(one, sorted(files)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
