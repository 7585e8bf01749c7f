//! Every statement the engine sends, prepared once per connection ([`Q::ALL`] at connect,
//! in one pipelined round trip) and then only bound and executed.
//!
//! Table names are unqualified: each connection's `search_path` is the workspace schema.
//! Expectations of batch steps call `deskfs_expect(ok, what)` (see `schema.rs`), which
//! raises SQLSTATE `DK001` with `what` as the error's detail; `deskfs_fence` raises
//! `DK002` for a fenced session.

/// The inode columns, in [`super::rows::inode`]'s order.
macro_rules! inode_cols {
    () => {
        "ino,kind,perm,uid,gid,rdev,nlink,size,atime,mtime,ctime,btime,data_version,target,local,dirty,listed"
    };
}

/// The inode columns prefixed with `i.` (joins).
macro_rules! inode_cols_i {
    () => {
        "i.ino,i.kind,i.perm,i.uid,i.gid,i.rdev,i.nlink,i.size,i.atime,i.mtime,i.ctime,i.btime,\
         i.data_version,i.target,i.local,i.dirty,i.listed"
    };
}

macro_rules! object_cols {
    () => {
        "path,key,ino,kind,data_version,meta_stamp,etag,size"
    };
}

macro_rules! pending_cols {
    () => {
        "path,recursive,seq,gen,due,since,attempts,last_error"
    };
}

/// Paths of the seeds `(seed, parent, name)` walked up to the root through dentries
/// (`/`-joined bytea), as in the SQLite engine. `$SEED` is spliced in.
///
/// The recursive walks join `dentries` through a LATERAL subquery that the planner may not
/// flatten (`OFFSET 0`): each step is then an index lookup (`dentries_ino`, or the
/// `(parent, name)` key) for the one row of the work table. As a plain join, the generic
/// plan — made while the table was small, kept for the connection's life — hashed a
/// sequential scan of the whole table at every step: 0.26–0.37 ms for a path nine levels
/// deep at 300 entries (`EXPLAIN ANALYZE`), growing with the workspace.
macro_rules! paths_cte {
    ($seed:expr) => {
        concat!(
            "WITH RECURSIVE up(seed, ino, path, depth) AS (",
            $seed,
            " UNION ALL SELECT up.seed, d.parent, d.name || '/'::bytea || up.path, up.depth + 1 \
             FROM up CROSS JOIN LATERAL (SELECT parent, name FROM dentries \
               WHERE dentries.ino = up.ino OFFSET 0) d \
             WHERE up.ino <> 1 AND up.depth < 4096)"
        )
    };
}

/// Inserts or re-marks a pending row for every root-reachable path of `up` (`$3` recursive,
/// `$4` not before, `$5` coalescing cap); one sequence number per mark.
macro_rules! mark_tail {
    () => {
        ", s AS (SELECT nextval('pending_seq') AS seq)
         INSERT INTO pending(path,recursive,seq,gen,due,since,attempts,last_error,owner)
         SELECT up.path, $3, s.seq, 1, $4, $4, 0, NULL,
           nullif(current_setting('deskfs.session', true), '')::bigint FROM up, s WHERE up.ino = 1
         ON CONFLICT(path_key) DO UPDATE SET
           recursive = pending.recursive OR excluded.recursive,
           gen = pending.gen + 1,
           due = least(excluded.due, pending.since + $5),
           owner = excluded.owner"
    };
}

macro_rules! queries {
    ($($name:ident = $sql:expr;)*) => {
        /// One prepared statement (see the module doc).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) enum Q { $($name),* }

        impl Q {
            /// Every statement, in the order of the per-connection cache.
            pub(super) const ALL: &'static [Q] = &[$(Q::$name),*];

            /// The statement's SQL text.
            pub(super) fn sql(self) -> &'static str {
                match self { $(Q::$name => $sql),* }
            }
        }
    };
}

queries! {
    // ---- transaction control ----
    BeginBatch = "BEGIN ISOLATION LEVEL READ COMMITTED";
    BeginWrite = "BEGIN ISOLATION LEVEL REPEATABLE READ";
    BeginRead = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
    BeginKeyed = "BEGIN ISOLATION LEVEL READ COMMITTED";
    // The key's transaction-level lock (per workspace schema): see `MetaEngine::txn_keyed`.
    KeyLock = "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '/key/' || $1::text, 0))";
    Commit = "COMMIT";
    Rollback = "ROLLBACK";
    SetSession = "SELECT set_config('deskfs.session', $1, false)";
    // Whether this transaction logged change-feed rows (set by the feed triggers).
    Logged = "SELECT coalesce(current_setting('deskfs.logged', true) = '1', false)";
    // A transaction of its own whose commit waits for the WAL flush, which makes every
    // commit before it durable (the WAL is one sequence); see `make_durable`.
    Durable = "SELECT set_config('synchronous_commit', 'on', true), pg_current_xact_id()::text";
    // The connection's commit mode (`off`: see the engine's module docs).
    SyncCommit = "SELECT current_setting('synchronous_commit')";

    // ---- batch steps (Op) ----
    CheckSession = "SELECT deskfs_fence(count(*) = 1, $1) FROM
        (SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE) s";
    TouchDir = "WITH u AS (UPDATE inodes SET nlink = nlink + $2, mtime = greatest(mtime, $3),
        ctime = greatest(ctime, $3) WHERE ino = $1 AND kind = 4 AND nlink > 0 RETURNING 1)
        SELECT deskfs_expect(count(*) = 1, 'dir_alive') FROM u";
    InsertInodeAt = concat!("INSERT INTO inodes(", inode_cols!(), ")
        VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)");
    InsertDentryOp = "INSERT INTO dentries(parent,name,ino) VALUES($1,$2,$3)";
    DeleteDentryOp = "WITH d AS (DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3
        RETURNING 1) SELECT deskfs_expect(count(*) = 1, 'entry_is') FROM d";
    MoveDentryOp = "WITH m AS (UPDATE dentries SET parent = $4, name = $5
        WHERE parent = $1 AND name = $2 AND ino = $3 RETURNING 1)
        SELECT deskfs_expect(count(*) = 1, 'entry_is') FROM m";
    RepointDentryOp = "WITH m AS (UPDATE dentries SET ino = $4
        WHERE parent = $1 AND name = $2 AND ino = $3 RETURNING 1)
        SELECT deskfs_expect(count(*) = 1, 'entry_is') FROM m";
    ExpectNameFree = "SELECT deskfs_expect(NOT EXISTS
        (SELECT 1 FROM dentries WHERE parent = $1 AND name = $2), 'name_free')";
    ExpectEntryIs = "SELECT deskfs_expect(count(*) = 1, 'entry_is') FROM
        (SELECT 1 FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3 FOR SHARE) s";
    LockDir = "SELECT 1 FROM inodes WHERE ino = $1 FOR UPDATE";
    ExpectEmpty = "SELECT deskfs_expect(NOT EXISTS
        (SELECT 1 FROM dentries WHERE parent = $1), 'dir_empty')";
    RenameLock = "SELECT pg_advisory_xact_lock(1684432499, hashtext(current_schema()))";
    ExpectNotAncestor = "WITH RECURSIVE up(ino, depth) AS (
          SELECT $2::bigint, 0
          UNION ALL
          SELECT d.parent, up.depth + 1 FROM up CROSS JOIN LATERAL
            (SELECT parent FROM dentries WHERE dentries.ino = up.ino OFFSET 0) d
          WHERE up.ino <> 1 AND up.ino <> $1 AND up.depth < 4096)
        SELECT deskfs_expect(NOT EXISTS (SELECT 1 FROM up WHERE ino = $1), 'not_ancestor')";
    AddNlink = "WITH u AS (UPDATE inodes SET nlink = greatest(nlink + $2::bigint, 0),
        ctime = greatest(ctime, $3) WHERE ino = $1 AND ($2::bigint <= 0 OR nlink > 0) RETURNING 1)
        SELECT deskfs_expect((SELECT count(*) FROM u) = 1,
          CASE WHEN EXISTS (SELECT 1 FROM inodes WHERE ino = $1) THEN 'linked'
               ELSE 'inode_exists' END)";
    ExpectAttrs = "SELECT deskfs_expect(count(*) = 1, 'attrs') FROM
        (SELECT 1 FROM inodes WHERE ino = $1 AND perm = $2 AND uid = $3 AND gid = $4
         FOR NO KEY UPDATE) s";
    SetAttrs = "WITH u AS (UPDATE inodes SET perm = coalesce($2, perm), uid = coalesce($3, uid),
        gid = coalesce($4, gid), atime = coalesce($5, atime), mtime = coalesce($6, mtime),
        ctime = greatest(ctime, coalesce($7, ctime)), dirty = coalesce($8, dirty),
        local = coalesce($9, local) WHERE ino = $1 RETURNING 1)
        SELECT deskfs_expect(count(*) = 1, 'inode_exists') FROM u";
    CommitContent = "WITH u AS (UPDATE inodes SET size = $2, mtime = $3, ctime = greatest(ctime, $4),
        data_version = data_version + 1, dirty = true, local = $5 WHERE ino = $1
        RETURNING data_version)
        SELECT deskfs_expect(count(*) = 1, 'inode_exists'), max(data_version) FROM u";
    Purge = "WITH d AS (DELETE FROM inodes WHERE ino = $1 AND nlink = 0
          AND NOT EXISTS (SELECT 1 FROM open_files WHERE ino = $1 AND count > 0) RETURNING ino),
        x AS (DELETE FROM xattrs WHERE ino IN (SELECT ino FROM d))
        SELECT count(*) FROM d";
    DeleteInode = "WITH x AS (DELETE FROM xattrs WHERE ino = $1) DELETE FROM inodes WHERE ino = $1";
    MarkPath = concat!(
        paths_cte!("SELECT 0::bigint, $1::bigint, $2::bytea, 0"),
        mark_tail!()
    );
    MarkInode = concat!(
        paths_cte!("SELECT cookie, parent, name, 0 FROM dentries WHERE ino = $1 AND $2::bytea IS NULL"),
        mark_tail!()
    );
    // `deskfs_add_open` as two plain statements: a SQL-language function body is planned
    // again at every call (~200 µs a call on the test machine, the costliest statement of
    // a pip install on two hosts); these keep their cached plans. The prune only runs
    // for a negative delta (a positive one never leaves a count at or below zero).
    AddOpen = "INSERT INTO open_files(ino, session, count) VALUES ($1, $2, $3)
        ON CONFLICT (ino, session) DO UPDATE SET count = open_files.count + excluded.count";
    PruneOpen = "DELETE FROM open_files WHERE ino = $1 AND session = $2 AND count <= 0";
    SetXattrAny = "INSERT INTO xattrs(ino,name,value) VALUES($1,$2,$3)
        ON CONFLICT(ino,name) DO UPDATE SET value = excluded.value";
    SetXattrCreate = "WITH i AS (INSERT INTO xattrs(ino,name,value) VALUES($1,$2,$3)
        ON CONFLICT(ino,name) DO NOTHING RETURNING 1)
        SELECT deskfs_expect(count(*) = 1, 'xattr_absent') FROM i";
    SetXattrReplace = "WITH u AS (UPDATE xattrs SET value = $3 WHERE ino = $1 AND name = $2
        RETURNING 1) SELECT deskfs_expect(count(*) = 1, 'xattr_present') FROM u";
    RemoveXattrOp = "WITH d AS (DELETE FROM xattrs WHERE ino = $1 AND name = $2 RETURNING 1)
        SELECT deskfs_expect(count(*) = 1, 'xattr_present') FROM d";
    GetInode = concat!("SELECT ", inode_cols!(), " FROM inodes WHERE ino = $1");

    // ---- engine-level reads ----
    LookupInode = concat!("SELECT ", inode_cols_i!(),
        " FROM dentries d JOIN inodes i ON i.ino = d.ino WHERE d.parent = $1 AND d.name = $2");
    AllocInos = "SELECT deskfs_alloc_inos($1)";
    Notify = "SELECT pg_notify($1, $2)";
    FeedStart = "SELECT pg_current_snapshot()::text,
        pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
        (SELECT coalesce(max(seq), 0) FROM changes)";
    // Two index scans: the rows after the cursor (primary key) and the late commits
    // below it (`changes_xid`: transactions from the cursor snapshot's xmin on, few). The
    // always-true upper bound on xid makes the generic plan estimate a narrow range and
    // pick that index; with `seq > $1 OR xid >= $2` (or the xid bound alone) it walked
    // the whole table in seq order (~1 ms a read at 20,000 changes, on every follower's
    // every read).
    FeedRead = "WITH m AS (SELECT pg_current_snapshot()::text AS snap,
          pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
          (SELECT coalesce(max(seq), 0) FROM changes) AS top),
        r AS ((SELECT seq, session, ino, parent, name FROM changes WHERE seq > $1
            ORDER BY seq LIMIT $4)
          UNION ALL
          (SELECT seq, session, ino, parent, name FROM changes
            WHERE xid >= $2 AND xid <= 9223372036854775807 AND seq <= $1
              AND NOT coalesce(pg_visible_in_snapshot(xid::text::xid8, $3::text::pg_snapshot), false))
          ORDER BY seq LIMIT $4)
        SELECT m.snap, m.xmin, m.top, r.seq, r.session, r.ino, r.parent, r.name
        FROM m LEFT JOIN r ON true ORDER BY r.seq";

    // ---- MetaTxn ----
    InsertInode = concat!("INSERT INTO inodes(", inode_cols!(), ")
        VALUES(nextval('inode_seq'),$1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16)
        RETURNING ino");
    UpdateInode = "UPDATE inodes SET kind=$2, perm=$3, uid=$4, gid=$5, rdev=$6, nlink=$7, size=$8,
        atime=$9, mtime=$10, ctime=$11, btime=$12, data_version=$13, target=$14, local=$15,
        dirty=$16, listed=$17 WHERE ino=$1";
    ScanInodes = concat!("SELECT ", inode_cols!(), " FROM inodes WHERE ino > $1 ORDER BY ino LIMIT $2");
    ScanDentries = "SELECT cookie, parent, name, ino FROM dentries WHERE cookie > $1
        ORDER BY cookie LIMIT $2";
    SetNlink = "UPDATE inodes SET nlink = $2 WHERE ino = $1";
    OrphanInodes = "SELECT ino FROM inodes WHERE nlink = 0 ORDER BY ino";
    DirtyInodes = concat!("SELECT ", inode_cols!(), " FROM inodes WHERE dirty ORDER BY ino");
    DirtyCaches = "SELECT DISTINCT local FROM inodes WHERE dirty AND local > 0 ORDER BY local";
    DirtyInCache = "SELECT count(*) FROM inodes WHERE dirty AND local = $1";
    LookupDentry = "SELECT cookie, ino FROM dentries WHERE parent = $1 AND name = $2";
    InsertDentry = "INSERT INTO dentries(parent,name,ino) VALUES($1,$2,$3)
        ON CONFLICT(parent,name) DO NOTHING RETURNING cookie";
    DeleteDentry = "DELETE FROM dentries WHERE parent = $1 AND name = $2";
    MoveDentry = "UPDATE dentries SET parent = $3, name = $4 WHERE parent = $1 AND name = $2";
    RepointDentry = "UPDATE dentries SET ino = $3 WHERE parent = $1 AND name = $2";
    ListDir = concat!("SELECT d.cookie, d.name, ", inode_cols_i!(),
        " FROM dentries d JOIN inodes i ON i.ino = d.ino
        WHERE d.parent = $1 AND d.cookie > $2 ORDER BY d.cookie LIMIT $3");
    HasChildren = "SELECT EXISTS (SELECT 1 FROM dentries WHERE parent = $1)";
    CountChildren = "SELECT count(*) FROM (SELECT 1 FROM dentries WHERE parent = $1 LIMIT $2) c";
    NamesOf = "SELECT parent, name FROM dentries WHERE ino = $1 ORDER BY cookie";
    PathsOf = concat!(
        paths_cte!("SELECT cookie, parent, name, 0 FROM dentries WHERE ino = $1"),
        " SELECT path FROM up WHERE ino = 1 ORDER BY seed"
    );
    ResolvePath = "WITH RECURSIVE w(depth, ino) AS (SELECT 0, $1::bigint
        UNION ALL SELECT w.depth + 1, d.ino FROM w CROSS JOIN LATERAL
          (SELECT ino FROM dentries WHERE parent = w.ino AND name = ($2::bytea[])[w.depth + 1]
            OFFSET 0) d
        WHERE w.depth < $3::int)
        SELECT ino FROM w WHERE depth = $3::int";
    GetXattr = "SELECT value FROM xattrs WHERE ino = $1 AND name = $2";
    LookXattr = "SELECT EXISTS (SELECT 1 FROM inodes WHERE ino = $1),
        (SELECT value FROM xattrs WHERE ino = $1 AND name = $2),
        EXISTS (SELECT 1 FROM xattrs WHERE ino = $1)";
    RemoveXattr = "DELETE FROM xattrs WHERE ino = $1 AND name = $2";
    ListXattrs = "SELECT name FROM xattrs WHERE ino = $1 ORDER BY name";
    GetObject = concat!("SELECT ", object_cols!(), " FROM objects WHERE path_key = sha256($1::bytea)");
    PutObject = concat!("INSERT INTO objects(", object_cols!(), ") VALUES($1,$2,$3,$4,$5,$6,$7,$8)
        ON CONFLICT(path_key) DO UPDATE SET key = excluded.key, ino = excluded.ino,
        kind = excluded.kind, data_version = excluded.data_version,
        meta_stamp = excluded.meta_stamp, etag = excluded.etag, size = excluded.size");
    GetObjects = concat!("SELECT ", object_cols!(),
        " FROM objects WHERE path_key IN (SELECT sha256(p) FROM unnest($1::bytea[]) p)");
    DeleteObject = "DELETE FROM objects WHERE path_key = sha256($1::bytea)";
    ObjectsUnder = concat!("SELECT ", object_cols!(),
        " FROM objects WHERE substr(path, 1, 2000) BETWEEN substr($1::bytea, 1, 2000) AND substr($2::bytea, 1, 2000)
         AND path >= $1::bytea AND path < $2::bytea ORDER BY substr(path, 1, 2000), path LIMIT $3");
    ObjectsAll = concat!("SELECT ", object_cols!(), " FROM objects ORDER BY substr(path, 1, 2000), path LIMIT $1");
    ObjectWithContent = concat!("SELECT ", object_cols!(),
        " FROM objects WHERE ino = $1 AND data_version = $2 LIMIT 1");
    MarkPending = "WITH s AS (SELECT nextval('pending_seq') AS seq),
        i AS (INSERT INTO pending(path,recursive,seq,gen,due,since,attempts,last_error,owner)
          SELECT $1, $2, s.seq, 1, $3, $3, 0, NULL,
            nullif(current_setting('deskfs.session', true), '')::bigint FROM s
          ON CONFLICT(path_key) DO UPDATE SET
            recursive = pending.recursive OR excluded.recursive,
            gen = pending.gen + 1,
            due = least(excluded.due, pending.since + $4),
            owner = excluded.owner)
        SELECT seq FROM s";
    RemarkPending = "INSERT INTO pending(path,recursive,seq,gen,due,since,attempts,last_error,owner)
        VALUES ($1, $2, $5, 1, $3, $3, 0, NULL,
          nullif(current_setting('deskfs.session', true), '')::bigint)
        ON CONFLICT(path_key) DO UPDATE SET
          recursive = pending.recursive OR excluded.recursive,
          seq = least(pending.seq, excluded.seq),
          gen = pending.gen + 1,
          due = least(excluded.due, pending.since + $4),
          owner = excluded.owner";
    DuePending = concat!("SELECT ", pending_cols!(),
        " FROM pending WHERE due <= $1 ORDER BY due LIMIT $2");
    // Rows this session marked (or nobody's: marked without a session) due by $1; other
    // sessions' rows only once due by $4 (see `MetaTxn::due_pending_for`).
    DuePendingFor = concat!("SELECT ", pending_cols!(),
        " FROM pending WHERE due <= $1 AND (owner IS NULL OR owner = $3 OR due <= $4)
          ORDER BY due LIMIT $2");
    FinishPending = "DELETE FROM pending WHERE path_key = sha256($1::bytea) AND gen = $2";
    FailPending = "UPDATE pending SET attempts = attempts + 1, last_error = $3, due = $4
        WHERE path_key = sha256($1::bytea) AND gen = $2";
    DeferPending = "UPDATE pending SET due = $3 WHERE path_key = sha256($1::bytea) AND gen = $2";
    DisownPending = "UPDATE pending SET owner = NULL
        WHERE path_key = sha256($1::bytea) AND gen = $2 AND owner IS NOT NULL";
    IsPending = "SELECT EXISTS (SELECT 1 FROM pending WHERE path_key = sha256($1::bytea))
        OR EXISTS (SELECT 1 FROM pending WHERE recursive
            AND path_key IN (SELECT sha256(p) FROM unnest($2::bytea[]) p))";
    PendingStats = "SELECT (SELECT count(*) FROM pending),
        (SELECT count(*) FROM pending WHERE attempts > 0),
        (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pending_seq)";
    PendingLastSeq = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pending_seq";
    PendingUpto = "SELECT EXISTS (SELECT 1 FROM pending WHERE seq <= $1)";
    PendingUptoRows = concat!("SELECT ", pending_cols!(),
        " FROM pending WHERE seq <= $1 ORDER BY seq LIMIT $2");
    PendingUnder = concat!("SELECT ", pending_cols!(),
        " FROM pending WHERE seq <= $1
         AND (path_key = sha256($2::bytea) OR (path >= $3::bytea AND path < $4::bytea))
         ORDER BY seq LIMIT $5");
    FailedPending = concat!("SELECT ", pending_cols!(),
        " FROM pending WHERE attempts > 0 ORDER BY due DESC LIMIT $1");
    DbNow = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";
    RegisterSession = "INSERT INTO sessions(host,pid,started,heartbeat) VALUES($1,$2,$3,$3)
        RETURNING id";
    Heartbeat = "UPDATE sessions SET heartbeat = $2 WHERE id = $1";
    Sessions = "SELECT id, host, pid, heartbeat FROM sessions ORDER BY id";
    // Expiry at READ COMMITTED, one statement each: the session row first (waits for
    // every transaction holding it with KEY SHARE), then its records with a fresh
    // snapshot that sees what those transactions wrote.
    ExpireSessionRow = "WITH d AS (DELETE FROM sessions WHERE id = $1 AND heartbeat < $2
        RETURNING 1) SELECT count(*) FROM d";
    ExpireSessionOpens = "DELETE FROM open_files WHERE session = $1
        AND NOT EXISTS (SELECT 1 FROM sessions WHERE id = $1)";
    // A session that may only be paused: its open-file records move to session -id (the
    // inodes stay unpurged until released), with the time under the held_opens.ID key.
    HoldSessionOpens = "WITH m AS (SELECT ino, count FROM open_files WHERE session = $1
        AND count > 0 AND NOT EXISTS (SELECT 1 FROM sessions WHERE id = $1)),
        h AS (INSERT INTO open_files(ino, session, count) SELECT ino, -$1::bigint, count FROM m
        ON CONFLICT (ino, session) DO UPDATE SET count = open_files.count + excluded.count)
        INSERT INTO kv(key, value) SELECT $2, $3 WHERE EXISTS (SELECT 1 FROM m)
        ON CONFLICT (key) DO UPDATE SET value = excluded.value";
    ReleaseHeldOpenRows = "DELETE FROM open_files WHERE session = -$1::bigint";
    KvPrefix = "SELECT key, value FROM kv WHERE starts_with(key, $1) ORDER BY key";
    DeleteKv = "DELETE FROM kv WHERE key = $1";
    ExpireSessionLocks = "DELETE FROM locks WHERE session = $1
        AND NOT EXISTS (SELECT 1 FROM sessions WHERE id = $1)";
    CheckSessionTxn = "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE) s";
    DeleteSession = "WITH o AS (DELETE FROM open_files WHERE session = $1),
        l AS (DELETE FROM locks WHERE session = $1)
        DELETE FROM sessions WHERE id = $1";
    OpenElsewhere = "SELECT EXISTS (SELECT 1 FROM open_files
        WHERE ino = $1 AND session <> $2 AND count > 0)";
    LocksOn = "SELECT session, owner, write, start_, end_, pid, fh FROM locks WHERE ino = $1
        ORDER BY start_";
    SetOwnerLocks = "WITH d AS (DELETE FROM locks WHERE ino = $1 AND session = $2 AND owner = $3)
        INSERT INTO locks(ino,session,owner,write,start_,end_,pid,fh)
        SELECT $1, $2, $3, w, s, e, p, f
        FROM unnest($4::boolean[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[])
          AS l(w, s, e, p, f)";
    DeleteFhLocks = "DELETE FROM locks WHERE ino = $1 AND session = $2 AND owner = $3 AND fh = $4";
    SessionLockCount = "SELECT count(*) FROM locks WHERE session = $1";
    WantUpload = "INSERT INTO wanted(ino,cache,since) VALUES($1,$2,$3)
        ON CONFLICT(ino) DO UPDATE SET cache = excluded.cache";
    WantedFor = "SELECT ino FROM wanted WHERE cache = $1 ORDER BY since, ino";
    ClearWanted = "DELETE FROM wanted WHERE ino = $1";
    GetKv = "SELECT value FROM kv WHERE key = $1";
    SetKv = "INSERT INTO kv(key,value) VALUES($1,$2)
        ON CONFLICT(key) DO UPDATE SET value = excluded.value";
    Usage = "SELECT count(*),
        coalesce(sum(CASE WHEN kind = 8 THEN size ELSE 0 END), 0)::bigint,
        count(*) FILTER (WHERE dirty AND nlink > 0),
        coalesce(sum(size) FILTER (WHERE dirty AND nlink > 0), 0)::bigint
        FROM inodes";
    PruneChanges = "DELETE FROM changes WHERE ts < $1";
}
