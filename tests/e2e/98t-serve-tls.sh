#!/usr/bin/env bash
# 98t-serve-tls: `deskfs serve --tls-cert CERT --tls-key KEY` serves the desks' API over
# HTTPS only, on a real FUSE mount of the embedded default (desk alice on it). With a
# self-signed certificate for IP 127.0.0.1 made here by openssl (RSA, PKCS#8 key; and an
# ECDSA P-256 one with a SEC1 key):
#   * the ready line says https://; curl trusting the certificate (--cacert) reads
#     GET /v1/desks/alice with a token, and a PUT then GET of a file round-trips byte for
#     byte (the file is on the mount); /mcp answers over TLS (401 without a token);
#   * curl not trusting it fails verification (exit 60: the server really speaks TLS
#     with that certificate), and plain http:// to the port gets no HTTP answer;
#   * a plain-HTTP client, a client refusing the certificate and a client that connects
#     and never shakes hands do not stop the server: the next HTTPS request is served;
#   * SIGTERM stops it (graceful shutdown) even with an idle TLS connection and a stalled
#     handshake open;
#   * bad input is one line (naming the problem and the fix) and a non-zero exit, before
#     anything listens: only one of the two flags, TLS with --socket, a missing file, a
#     directory, a file with no certificate or no private key, swapped files, an
#     encrypted key, a key that is not the certificate's.
# e2e-timeout: 300
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_cmd curl openssl

ws_format emb
ws_mount emb "$MNT"
root=$MNT/desks
dfs desk create alice > /dev/null || fail "desk create alice"
tok=$(dfs token create alice 2> /dev/null) || fail "token create"

# Certificates: self-signed for IP 127.0.0.1 (CA:FALSE: a server's own certificate).
C=$T/certs
mkdir -p "$C"
mkcert() { # NAME KEYARGS...
  local name=$1
  shift
  openssl req -x509 "$@" -nodes -keyout "$C/$name.key" -out "$C/$name.crt" -days 36500 \
    -subj "/CN=deskfs e2e $name" -addext "subjectAltName=IP:127.0.0.1" \
    -addext "basicConstraints=critical,CA:FALSE" -addext "extendedKeyUsage=serverAuth" \
    2> "$C/$name.err" || fail "openssl req ($name): $(cat "$C/$name.err")"
}
mkcert rsa -newkey rsa:2048
mkcert ec -newkey ec -pkeyopt ec_paramgen_curve:prime256v1
openssl ec -in "$C/ec.key" -out "$C/ec-sec1.key" 2> /dev/null || fail "openssl ec"
grep -q "BEGIN PRIVATE KEY" "$C/rsa.key" || fail "the RSA key is not PKCS#8"
grep -q "BEGIN EC PRIVATE KEY" "$C/ec-sec1.key" || fail "the EC key is not SEC1"

# start_tls NAME CERT KEY: starts the server; sets PID and BASE (https://127.0.0.1:PORT).
start_tls() {
  local name=$1 cert=$2 key=$3
  "$DESKFS" serve --listen 127.0.0.1:0 --tls-cert "$cert" --tls-key "$key" \
    > "$T/serve-$name.out" 2> "$T/serve-$name.err" < /dev/null &
  PID=$!
  register_pid "$PID"
  wait_for 20 grep -q "://" "$T/serve-$name.out" ||
    fail "$name: serve did not start: $(cat "$T/serve-$name.err")"
  BASE=$(grep -o 'https://[0-9.:]*' "$T/serve-$name.out") ||
    fail "$name: the ready line does not say https://: $(cat "$T/serve-$name.out")"
  grep -q "^serving the desks of .* at https://127.0.0.1:[0-9]* (" "$T/serve-$name.out" ||
    fail "$name: ready line: $(cat "$T/serve-$name.out")"
  log "$name: serving at $BASE"
}

# good NAME CACERT: GET the desk with the token through TLS trusting CACERT.
good() {
  local got
  got=$(curl -sS --max-time 20 --cacert "$2" -H "Authorization: Bearer $tok" "$BASE/v1/desks/alice" 2>&1) ||
    fail "$1: https GET /v1/desks/alice failed: $got"
  [[ $got == *'"agent":"alice"'* ]] || fail "$1: GET /v1/desks/alice said: $got"
}

# ---------------------------------------------------------------- RSA, PKCS#8 key
start_tls rsa "$C/rsa.crt" "$C/rsa.key"
good rsa "$C/rsa.crt"
# A PUT then GET round-trips (binary, 1 MiB), and the file is on the mount.
head -c 1048576 /dev/urandom > "$T/blob"
code=$(curl -sS --max-time 30 --cacert "$C/rsa.crt" -o "$T/put.out" -w '%{http_code}' \
  -H "Authorization: Bearer $tok" -X PUT --data-binary @"$T/blob" "$BASE/v1/desks/alice/files/notes/tls-blob.bin") ||
  fail "https PUT failed"
[[ $code == 20[01] ]] || fail "https PUT: HTTP $code: $(cat "$T/put.out")"
curl -sS --max-time 30 --cacert "$C/rsa.crt" -o "$T/got" -H "Authorization: Bearer $tok" \
  --fail "$BASE/v1/desks/alice/files/notes/tls-blob.bin" || fail "https GET of the file failed"
assert_file_eq "$T/blob" "$T/got" "PUT then GET over https"
assert_file_eq "$T/blob" "$root/alice/notes/tls-blob.bin" "the file PUT over https, on the mount"
# The negotiated protocol is TLS with HTTP/1.1.
v=$(curl -sS --max-time 20 --cacert "$C/rsa.crt" -o /dev/null -w '%{http_version} %{ssl_verify_result}' \
  -H "Authorization: Bearer $tok" "$BASE/v1/desks/alice")
[[ $v == "1.1 0" ]] || fail "http version / verify result: $v"
# /mcp over TLS: no token, 401 with WWW-Authenticate.
code=$(curl -sS --max-time 20 --cacert "$C/rsa.crt" -o /dev/null -D "$T/mcp.h" -w '%{http_code}' \
  -X POST -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
  --data '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}' "$BASE/mcp")
[[ $code == 401 ]] && grep -qi '^www-authenticate: Bearer' "$T/mcp.h" || fail "/mcp without a token over https: HTTP $code"

# Not trusting the certificate: verification fails (curl exit 60).
rc=0
curl -sS --max-time 20 -o /dev/null "$BASE/v1/desks/alice" 2> "$T/noca.err" || rc=$?
((rc == 60)) || fail "curl without --cacert: exit $rc (want 60, certificate problem): $(cat "$T/noca.err")"
good "after a client refused the certificate" "$C/rsa.crt"
# A certificate for another name: refused by the client too, and the server goes on.
rc=0
curl -sS --max-time 20 --cacert "$C/ec.crt" -o /dev/null "$BASE/v1/desks/alice" 2> /dev/null || rc=$?
((rc == 60)) || fail "curl trusting another certificate: exit $rc (want 60)"
# Plain HTTP to the HTTPS port: no HTTP answer.
plain=${BASE/https:/http:}
rc=0
got=$(curl -sS --max-time 20 -H "Authorization: Bearer $tok" "$plain/v1/desks/alice" 2> "$T/plain.err") || rc=$?
((rc != 0)) || fail "plain http:// to the https port answered: $got"
[[ $got != *'"agent"'* ]] || fail "plain http:// got the desk: $got"
log "plain http:// to the https port: curl exit $rc ($(head -c 120 "$T/plain.err"))"
good "after a plain-HTTP client" "$C/rsa.crt"
pid_running "$PID" || fail "the server died: $(cat "$T/serve-rsa.err")"

# A client that connects and never shakes hands (held open) does not hold up the next.
port=${BASE##*:}
exec 3<> "/dev/tcp/127.0.0.1/$port"
start=$SECONDS
good "while a handshake is stalled" "$C/rsa.crt"
((SECONDS - start < 5)) || fail "an https request waited $((SECONDS - start)) s behind a stalled handshake"
# An idle TLS connection (kept open by openssl s_client) too, then SIGTERM: the server stops.
mkfifo "$T/sc.in"
openssl s_client -quiet -connect "127.0.0.1:$port" -CAfile "$C/rsa.crt" -verify_return_error \
  < "$T/sc.in" > /dev/null 2> "$T/sc.err" &
sc=$!
exec 4> "$T/sc.in" # s_client's stdin stays open: it keeps its connection, idle
register_pid "$sc"
sleep 1
pid_running "$sc" || fail "openssl s_client did not stay connected: $(cat "$T/sc.err")"
kill -TERM "$PID"
wait_for 15 bash -c "! kill -0 $PID 2> /dev/null" || fail "serve did not stop on SIGTERM (stalled handshake and idle TLS connection open)"
exec 3>&- 4>&-
kill "$sc" 2> /dev/null || true
log "rsa: SIGTERM stopped the server with a stalled handshake and an idle TLS connection open"

# ---------------------------------------------------------------- ECDSA, SEC1 key
start_tls ec "$C/ec.crt" "$C/ec-sec1.key"
good ec "$C/ec.crt"
rc=0
curl -sS --max-time 20 --cacert "$C/rsa.crt" -o /dev/null "$BASE/v1/desks/alice" 2> /dev/null || rc=$?
((rc == 60)) || fail "ec: curl trusting the RSA certificate: exit $rc (want 60)"
kill -TERM "$PID"
wait_for 15 bash -c "! kill -0 $PID 2> /dev/null" || fail "ec: serve did not stop on SIGTERM"

# ---------------------------------------------------------------- bad input
printf 'just text\n' > "$C/text.pem"
openssl pkey -in "$C/rsa.key" -aes256 -passout pass:x -out "$C/enc.key" 2> /dev/null || fail "openssl pkey -aes256"
expect_bad() { # WHAT EXPECTED-SUBSTRING SERVE-ARGS...
  local what=$1 want=$2 out rc=0
  shift 2
  out=$(timeout 20 "$DESKFS" serve "$@" 2>&1 < /dev/null) || rc=$?
  ((rc != 0 && rc != 124)) || fail "$what: exit $rc"
  [[ $(wc -l <<< "$out") == 1 && $out == *"$want"* ]] || fail "$what: said: $out"
  log "$what: $out"
}
expect_bad "only --tls-cert" "--tls-cert needs --tls-key" --listen 127.0.0.1:0 --tls-cert "$C/rsa.crt"
expect_bad "only --tls-key" "--tls-key needs --tls-cert" --listen 127.0.0.1:0 --tls-key "$C/rsa.key"
expect_bad "TLS on a Unix socket" "drop --socket or the TLS flags" --socket "$T/s.sock" \
  --tls-cert "$C/rsa.crt" --tls-key "$C/rsa.key"
[[ ! -e $T/s.sock ]] || fail "TLS on a Unix socket: the socket was made"
expect_bad "missing certificate" "cannot read --tls-cert $C/none.crt" --listen 127.0.0.1:0 --tls-cert "$C/none.crt" --tls-key "$C/rsa.key"
expect_bad "missing key" "cannot read --tls-key $C/none.key" --listen 127.0.0.1:0 --tls-cert "$C/rsa.crt" --tls-key "$C/none.key"
expect_bad "a directory as certificate" "is a directory" --listen 127.0.0.1:0 --tls-cert "$C" --tls-key "$C/rsa.key"
expect_bad "no certificate in the file" "holds no PEM certificate" --listen 127.0.0.1:0 --tls-cert "$C/text.pem" --tls-key "$C/rsa.key"
expect_bad "no key in the file" "holds no private key" --listen 127.0.0.1:0 --tls-cert "$C/rsa.crt" --tls-key "$C/text.pem"
expect_bad "swapped files" "are --tls-cert and --tls-key swapped" --listen 127.0.0.1:0 --tls-cert "$C/rsa.key" --tls-key "$C/rsa.crt"
expect_bad "an encrypted key" "holds an encrypted private key" --listen 127.0.0.1:0 --tls-cert "$C/rsa.crt" --tls-key "$C/enc.key"
expect_bad "another certificate's key" "is not the private key of the certificate" --listen 127.0.0.1:0 \
  --tls-cert "$C/rsa.crt" --tls-key "$C/ec-sec1.key"

ws_umount "$MNT"
log "PASS"
