#!/usr/bin/env bash
# 30-agent-workload: what an agent does on its workspace, on a workspace on the test's
# store (tests/store.sh: DESKFS_E2E_STORE, S3 by default with credentials from AWS_*
# only; 30z/30g run it on Azure/GCS emulators): git clone of a real multi-commit repo, edit + commit +
# branch + merge, make of a C project (incl. mtime-driven rebuild), cargo build of a tiny
# crate with CARGO_TARGET_DIR on the mount, python3 -m venv + its python, two SQLite
# databases (rollback journal and WAL) with 600/300 transactions. Then umount, check every
# file is an object of the same size in the bucket (content of a sample via rclone cat
# on S3, the emulator's own client on Azure/GCS),
# remount with an empty cache and check the tree is identical, git fsck --full is clean,
# make is up to date, binaries run, sqlite integrity_check is ok with the same rows.
# e2e-cost: 37
# e2e-timeout: 1200
source "$(dirname "$0")/../lib.sh"
need_deskfs
need_store
need_cmd git make cc sqlite3
python3 -c 'import venv, sqlite3' 2> /dev/null || skip_or_fail "python3 venv/sqlite3 modules missing (apt-get install python3-venv)"

NAME=agent
ws_format "$NAME" --bucket "$(store_url)"   # S3: endpoint, region and keys from AWS_* env
ws_mount "$NAME" "$MNT" --cache-dir "$T/cache1"
W=$MNT/work
mkdir "$W"

# ---------------------------------------------------------------- source repo (local disk)
SRC=$T/src
mkdir -p "$SRC"
if [[ -d /usr/include/linux ]] && (($(find /usr/include/linux -type f | wc -l) >= 200)); then
  cp -a /usr/include/linux "$SRC/linux"
else
  cp -a "$ROOT/crates" "$SRC/crates"
fi
log "source repo from $(find "$SRC" -type f | wc -l) files"
git -C "$SRC" init -q
mapfile -t files < <(cd "$SRC" && find . -path ./.git -prune -o -type f -print | sort)
half=$((${#files[@]} / 2))
(cd "$SRC" && git add -- "${files[@]:0:half}" && git commit -q -m "first half")
(cd "$SRC" && git add -A && git commit -q -m "second half")
for f in "${files[@]:0:30}"; do echo "/* edit $f */" >> "$SRC/$f"; done
(cd "$SRC" && git commit -q -am "edit 30 files")
moved=$(cd "$SRC" && git ls-files | awk -F/ 'NF >= 3 && d == "" { d = $1 "/" $2 } END { print d }')
[[ -n $moved ]] || fail "source tree has no subdirectory to move"
mapfile -t del < <(printf '%s\n' "${files[@]:half}" | sed 's|^\./||' | grep -v "^$moved/" | sed -n 1,5p)
(cd "$SRC" && git mv "$moved" "$moved-moved" && git rm -q -- "${del[@]}" && git commit -q -m "move a dir, delete 5 files")
printf '#!/bin/sh\necho tool-ok\n' > "$SRC/tool.sh"
chmod +x "$SRC/tool.sh"
ln -s tool.sh "$SRC/tool-link"
(cd "$SRC" && git add tool.sh tool-link && git commit -q -m "script and symlink")
SRC_COMMITS=5

# ---------------------------------------------------------------- git on the mount
log "git clone onto the mount"
git clone -q "file://$SRC" "$W/repo"
R=$W/repo
assert_eq "$(git -C "$SRC" rev-parse HEAD)" "$(git -C "$R" rev-parse HEAD)" "cloned HEAD"
assert_eq "" "$(git -C "$R" status --porcelain)" "git status right after clone"
assert_eq "tool-ok" "$("$R/tool.sh")" "executable from the clone"
first=$(git -C "$R" ls-files | sed -n 1p)
echo "agent edit" >> "$R/$first"
mkdir -p "$R/notes"
echo "what I learned" > "$R/notes/agent.md"
git -C "$R" add -A
git -C "$R" commit -q -m "agent: edit and notes"
git -C "$R" checkout -q -b feature
echo "feature work" > "$R/feature.txt"
git -C "$R" add feature.txt
git -C "$R" commit -q -m "feature"
git -C "$R" checkout -q main
git -C "$R" merge -q --no-ff -m "merge feature" feature
assert_eq "" "$(git -C "$R" status --porcelain)" "git status after commits"
assert_eq $((SRC_COMMITS + 3)) "$(git -C "$R" rev-list --count HEAD)" "commit count"
git -C "$R" fsck --full --no-progress 2> "$T/fsck.1" || fail "git fsck --full on the mount failed: $(head -n 20 "$T/fsck.1")"
HEAD_BEFORE=$(git -C "$R" rev-parse HEAD)

# ---------------------------------------------------------------- make
log "make of a C project"
C=$W/cproj
mkdir "$C"
cat > "$C/util.h" <<'EOF'
int answer(void);
EOF
cat > "$C/util.c" <<'EOF'
#include "util.h"
int answer(void) { return 42; }
EOF
cat > "$C/hello.c" <<'EOF'
#include <stdio.h>
#include "util.h"
int main(void) { printf("hello from deskfs %d\n", answer()); return 0; }
EOF
printf 'CC ?= cc\nhello: hello.o util.o\n\t$(CC) -o $@ hello.o util.o\n%%.o: %%.c util.h\n\t$(CC) -O1 -c $< -o $@\nclean:\n\trm -f hello *.o\n' > "$C/Makefile"
make -C "$C" -j2 > "$T/make.1" 2>&1 || fail "make failed: $(cat "$T/make.1")"
assert_eq "hello from deskfs 42" "$("$C/hello")" "output of the built program"
sleep 1.1
touch "$C/util.c"
make -C "$C" > "$T/make.2" 2>&1 || fail "second make failed: $(cat "$T/make.2")"
grep -q 'util\.o' "$T/make.2" || fail "make did not rebuild util.o after touch util.c (mtimes?): $(cat "$T/make.2")"
! grep -q -- '-c hello.c' "$T/make.2" || fail "make rebuilt hello.o although hello.c did not change: $(cat "$T/make.2")"
make -q -C "$C" || fail "make -q: project not up to date right after make"

# ---------------------------------------------------------------- cargo
CARGO_DONE=0
if command -v cargo > /dev/null; then
  log "cargo build with CARGO_TARGET_DIR on the mount"
  K=$W/tinycrate
  mkdir -p "$K/src"
  printf '[package]\nname = "tinycrate"\nversion = "0.1.0"\nedition = "2021"\n\n[workspace]\n' > "$K/Cargo.toml"
  printf 'mod util;\nfn main() {\n    println!("tinycrate {}", util::sum(&[1, 2, 3, 4]));\n}\n' > "$K/src/main.rs"
  printf 'pub fn sum(v: &[u64]) -> u64 {\n    v.iter().sum()\n}\n' > "$K/src/util.rs"
  CARGO_TARGET_DIR=$W/cargo-target timeout 300 cargo build --offline -q --manifest-path "$K/Cargo.toml" > "$T/cargo.out" 2>&1 \
    || fail "cargo build on the mount failed: $(tail -n 30 "$T/cargo.out")"
  assert_eq "tinycrate 10" "$("$W/cargo-target/debug/tinycrate")" "output of the cargo-built binary"
  CARGO_DONE=1
else
  log "cargo not found: cargo part not run"
fi

# ---------------------------------------------------------------- python venv
log "python3 -m venv on the mount"
timeout 300 python3 -m venv "$W/venv" > "$T/venv.out" 2>&1 || fail "python3 -m venv failed: $(tail -n 20 "$T/venv.out")"
assert_eq "$W/venv" "$("$W/venv/bin/python" -c 'import sys; print(sys.prefix)')" "sys.prefix of the venv python"
"$W/venv/bin/python" -m pip --version > /dev/null 2>&1 || fail "pip inside the venv does not run"

# ---------------------------------------------------------------- sqlite
log "sqlite: 600 transactions (rollback journal) + 300 (WAL)"
cat > "$T/db.py" <<'PY'
import hashlib, os, sqlite3, sys
mode, path = sys.argv[1], sys.argv[2]
def digest(db):
    h = hashlib.sha256()
    n = 0
    for row in db.execute("select id, k, v from t order by id"):
        h.update(repr(row).encode()); n += 1
    return f"{n} {h.hexdigest()}"
if mode == "write-journal" or mode == "write-wal":
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    if mode == "write-wal":
        assert db.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
        n = 300
    else:
        db.execute("pragma synchronous=full")
        n = 600
    db.execute("create table t(id integer primary key, k text, v blob)")
    for i in range(n):
        db.execute("begin")
        db.execute("insert into t(k, v) values (?, ?)", (f"k{i}", os.urandom(64 + i % 300)))
        db.execute("commit")
    for i in range(1, n, 10):
        db.execute("begin"); db.execute("update t set k = k || '-u' where id = ?", (i,)); db.execute("commit")
    for i in range(2, n, 20):
        db.execute("begin"); db.execute("delete from t where id = ?", (i,)); db.execute("commit")
    print(digest(db))
    db.close()
elif mode == "digest":
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    print(digest(db))
PY
DB1_DIGEST=$(timeout 300 python3 "$T/db.py" write-journal "$W/journal.db") || fail "sqlite rollback-journal workload failed"
DB2_DIGEST=$(timeout 300 python3 "$T/db.py" write-wal "$W/wal.db") || fail "sqlite WAL workload failed"
assert_eq ok "$(sqlite3 "$W/journal.db" 'pragma integrity_check')" "integrity_check journal.db"
assert_eq ok "$(sqlite3 "$W/wal.db" 'pragma integrity_check')" "integrity_check wal.db"
[[ ! -e $W/journal.db-journal ]] || fail "journal.db-journal left behind after the last commit"

# ---------------------------------------------------------------- umount, bucket check
tree_manifest "$W" > "$T/manifest.before"
log "manifest: $(wc -l < "$T/manifest.before") entries, $(grep -c "^f	" "$T/manifest.before") files"
ws_umount "$MNT"

log "bucket: every file is an object of the same size"
store_keys "$STORE_PREFIX/work/" > "$T/keys"
awk -F'\t' -v p="$STORE_PREFIX/work/" 'index($2, p) == 1 { print substr($2, length(p) + 1) "\t" $1 }' "$T/keys" | sort > "$T/key-sizes"
awk -F'\t' '$1 == "f" { print $5 "\t" $3 }' "$T/manifest.before" | sort > "$T/file-sizes"
missing=$(comm -23 "$T/file-sizes" "$T/key-sizes" | sed -n 1,10p)
[[ -z $missing ]] || fail "files without an object of the same size in the bucket (path<TAB>size): $missing"

log "bucket: content of a sample (store_cat: rclone cat on S3; + sha256)"
pack=$(awk -F'\t' '$1 == "f" && $5 ~ /^repo\/\.git\/objects\/pack\/.*\.pack$/ { print $5; exit }' "$T/manifest.before")
sample=("repo/$first" repo/notes/agent.md repo/.git/HEAD repo/.git/index cproj/hello cproj/util.o
  journal.db wal.db venv/pyvenv.cfg ${pack:+"$pack"})
((CARGO_DONE)) && sample+=(cargo-target/debug/tinycrate)
for p in "${sample[@]}"; do
  exp=$(awk -F'\t' -v p="$p" '$1 == "f" && $5 == p { print $4 }' "$T/manifest.before")
  [[ -n $exp ]] || fail "sample file $p is not in the manifest"
  store_exists "$(store_key "work/$p")" || fail "object $(store_key "work/$p") missing"
  got=$(store_cat "$(store_key "work/$p")" | sha)
  assert_eq "$exp" "$got" "sha256 of object work/$p (store_cat) vs the file"
done

# ---------------------------------------------------------------- remount (cold cache)
log "remount with an empty cache dir"
ws_mount "$NAME" "$MNT2" --cache-dir "$T/cache2"
W2=$MNT2/work
R2=$W2/repo
assert_same_tree "$T/manifest.before" "$W2" "after umount + cold remount"
git -C "$R2" fsck --full --no-progress 2> "$T/fsck.2" || fail "git fsck --full after remount failed: $(head -n 20 "$T/fsck.2")"
assert_eq "$HEAD_BEFORE" "$(git -C "$R2" rev-parse HEAD)" "HEAD after remount"
assert_eq "" "$(git -C "$R2" status --porcelain)" "git status after remount"
assert_eq $((SRC_COMMITS + 3)) "$(git -C "$R2" rev-list --count HEAD)" "commit count after remount"
make -q -C "$W2/cproj" || fail "make -q after remount: the project is not up to date (mtimes not preserved?)"
assert_eq "hello from deskfs 42" "$("$W2/cproj/hello")" "built program after remount"
((CARGO_DONE)) && assert_eq "tinycrate 10" "$("$W2/cargo-target/debug/tinycrate")" "cargo binary after remount"
assert_eq "$W2/venv" "$("$W2/venv/bin/python" -c 'import sys; print(sys.prefix)')" "venv python after remount"
assert_eq ok "$(sqlite3 "$W2/journal.db" 'pragma integrity_check')" "integrity_check journal.db after remount"
assert_eq ok "$(sqlite3 "$W2/wal.db" 'pragma integrity_check')" "integrity_check wal.db after remount"
assert_eq "$DB1_DIGEST" "$(python3 "$T/db.py" digest "$W2/journal.db")" "journal.db rows after remount"
assert_eq "$DB2_DIGEST" "$(python3 "$T/db.py" digest "$W2/wal.db")" "wal.db rows after remount"
# and the workspace keeps working: one more commit after the remount
echo "after remount" >> "$R2/notes/agent.md"
git -C "$R2" commit -q -am "after remount"
git -C "$R2" fsck --full --no-progress 2> "$T/fsck.3" || fail "git fsck --full after a commit on the remount failed: $(head -n 20 "$T/fsck.3")"
ws_umount "$MNT2"

log "PASS"
