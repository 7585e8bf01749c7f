#!/usr/bin/env python3
"""s3.py - a tiny S3 client (python3 stdlib only, SigV4, path-style) used by the e2e tests
to look at the bucket *without* going through deskfs, key by key (rclone hides directory
marker objects and metadata; this does not).

    s3.py ls PREFIX          every key under PREFIX (no delimiter): "<size>\t<key>" per line
    s3.py get KEY            object body to stdout (exit 2 if missing)
    s3.py head KEY           status line + response headers (x-amz-meta-*), exit 2 if missing
    s3.py put KEY FILE|-     upload a (small) file; FILE '-' = stdin
    s3.py rm KEY             delete one key
    s3.py rmprefix PREFIX    delete every key under PREFIX

Connection settings come from the environment, as printed by scripts/s3-server.sh:
BENCH_S3_ENDPOINT, BENCH_S3_ACCESS_KEY, BENCH_S3_SECRET_KEY, BENCH_S3_REGION,
BENCH_S3_BUCKET (the AWS_* equivalents are used when a BENCH_* one is missing).
"""
import datetime
import hashlib
import hmac
import http.client
import os
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def env(name, aws_name, default=None):
    v = os.environ.get(name) or os.environ.get(aws_name) or default
    if v is None:
        sys.exit(f"s3.py: {name} (or {aws_name}) is not set")
    return v


ENDPOINT = env("BENCH_S3_ENDPOINT", "AWS_ENDPOINT_URL")
ACCESS = env("BENCH_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
SECRET = env("BENCH_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY")
REGION = env("BENCH_S3_REGION", "AWS_REGION", "us-east-1")
BUCKET = env("BENCH_S3_BUCKET", "S3_BUCKET", "bench")


def q(s, safe="-_.~"):
    return urllib.parse.quote(s, safe=safe)


def request(method, key="", query=None, body=b"", timeout=60):
    """One signed request; returns (status, headers dict (lower-case), body bytes)."""
    u = urllib.parse.urlsplit(ENDPOINT)
    path = "/" + q(BUCKET) + ("/" + q(key, safe="-_.~/") if key else "")
    query = query or {}
    cq = "&".join(f"{q(k)}={q(str(v))}" for k, v in sorted(query.items()))
    now = datetime.datetime.now(datetime.timezone.utc)
    amzdate = now.strftime("%Y%m%dT%H%M%SZ")
    day = now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(body).hexdigest()
    headers = {"host": u.netloc, "x-amz-content-sha256": payload_hash, "x-amz-date": amzdate}
    signed = ";".join(sorted(headers))
    canon = "\n".join([method, path, cq,
                       "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                       signed, payload_hash])
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                         hashlib.sha256(canon.encode()).hexdigest()])
    k = ("AWS4" + SECRET).encode()
    for part in (day, REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={ACCESS}/{scope}, "
                                f"SignedHeaders={signed}, Signature={sig}")
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(u.netloc, timeout=timeout)
    conn.request(method, path + ("?" + cq if cq else ""), body=body or None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def die_http(what, status, data):
    sys.exit(f"s3.py: {what}: HTTP {status}: {data[:300].decode(errors='replace')}")


def list_keys(prefix):
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    token = None
    while True:
        query = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
        if token:
            query["continuation-token"] = token
        st, _, data = request("GET", "", query)
        if st != 200:
            die_http(f"list {prefix!r}", st, data)
        root = ET.fromstring(data)
        for c in root.iter(ns + "Contents"):
            yield c.find(ns + "Key").text, int(c.find(ns + "Size").text)
        if (root.findtext(ns + "IsTruncated") or "false").lower() != "true":
            return
        token = root.findtext(ns + "NextContinuationToken")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "ls" and len(args) <= 1:
        for key, size in list_keys(args[0] if args else ""):
            sys.stdout.write(f"{size}\t{key}\n")
    elif cmd == "get" and len(args) == 1:
        st, _, data = request("GET", args[0], timeout=300)
        if st == 404:
            print(f"s3.py: no such key: {args[0]}", file=sys.stderr)
            return 2
        if st != 200:
            die_http(f"get {args[0]!r}", st, data)
        sys.stdout.buffer.write(data)
    elif cmd == "head" and len(args) == 1:
        st, hdrs, data = request("HEAD", args[0])
        if st == 404:
            print(f"s3.py: no such key: {args[0]}", file=sys.stderr)
            return 2
        if st != 200:
            die_http(f"head {args[0]!r}", st, data)
        print(f"HTTP {st}")
        for k in sorted(hdrs):
            print(f"{k}: {hdrs[k]}")
    elif cmd == "put" and len(args) == 2:
        body = sys.stdin.buffer.read() if args[1] == "-" else open(args[1], "rb").read()
        st, _, data = request("PUT", args[0], body=body, timeout=300)
        if st != 200:
            die_http(f"put {args[0]!r}", st, data)
    elif cmd == "rm" and len(args) == 1:
        st, _, data = request("DELETE", args[0])
        if st not in (200, 204):
            die_http(f"rm {args[0]!r}", st, data)
    elif cmd == "rmprefix" and len(args) == 1:
        if not args[0]:
            sys.exit("s3.py: refusing to delete the whole bucket")
        for key, _ in list(list_keys(args[0])):
            st, _, data = request("DELETE", key)
            if st not in (200, 204):
                die_http(f"rm {key!r}", st, data)
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (OSError, http.client.HTTPException) as e:
        sys.exit(f"s3.py: cannot reach {ENDPOINT}: {e}")
