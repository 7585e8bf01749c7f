//! The PostgreSQL schema of a workspace: the SQLite engine's tables with PostgreSQL types
//! (bytea names and paths, bigint numbers holding `u64` values as `i64`, boolean flags),
//! the sequences, the helper functions the batch statements call, the change-feed
//! triggers, and the checks `open` runs.

use tokio_postgres::Client;

use crate::{MetaError, Result, ROOT_INO};

/// Schema version kept in `kv.schema_version`. Databases with a higher number are refused
/// with [`MetaError::TooNew`].
pub const SCHEMA_VERSION: i64 = 1;

/// SQLSTATE raised by `deskfs_expect` (a batch expectation failed; detail = what).
pub(super) const SQLSTATE_EXPECT: &str = "DK001";
/// SQLSTATE raised by `deskfs_fence` (the session is not registered).
pub(super) const SQLSTATE_FENCED: &str = "DK002";

/// Tables, sequences, functions and triggers; `{S}` is the (validated, quote-free)
/// schema name. Functions name their tables with the schema, so they work whatever the
/// caller's `search_path`.
const DDL: &str = r#"
CREATE SEQUENCE {S}.inode_seq START 2;
CREATE TABLE {S}.inodes(
  ino bigint PRIMARY KEY,
  kind bigint NOT NULL, perm bigint NOT NULL, uid bigint NOT NULL, gid bigint NOT NULL,
  rdev bigint NOT NULL, nlink bigint NOT NULL, size bigint NOT NULL,
  atime bigint NOT NULL, mtime bigint NOT NULL, ctime bigint NOT NULL, btime bigint NOT NULL,
  data_version bigint NOT NULL, target bytea, local bigint NOT NULL, dirty boolean NOT NULL,
  listed bigint NOT NULL);
CREATE INDEX inodes_dirty ON {S}.inodes(ino) WHERE dirty;
CREATE INDEX inodes_orphan ON {S}.inodes(ino) WHERE nlink = 0;
CREATE TABLE {S}.dentries(
  cookie bigserial PRIMARY KEY,
  parent bigint NOT NULL, name bytea NOT NULL, ino bigint NOT NULL,
  UNIQUE(parent, name));
CREATE INDEX dentries_ino ON {S}.dentries(ino);
CREATE INDEX dentries_parent_cookie ON {S}.dentries(parent, cookie);
CREATE TABLE {S}.xattrs(ino bigint NOT NULL, name bytea NOT NULL, value bytea NOT NULL,
  PRIMARY KEY(ino, name));
-- Paths reach PATH_MAX (4096 bytes), beyond a btree entry's limit (~2700 bytes): the
-- key is the path's SHA-256, and the ordered scans of a prefix use an index on the
-- path's first 2000 bytes, sorting the (rare) ties on the whole path.
CREATE TABLE {S}.objects(path bytea NOT NULL,
  path_key bytea GENERATED ALWAYS AS (sha256(path)) STORED PRIMARY KEY,
  key text NOT NULL, ino bigint NOT NULL,
  kind bigint NOT NULL, data_version bigint NOT NULL, meta_stamp bigint NOT NULL,
  etag text, size bigint NOT NULL);
CREATE INDEX objects_ino ON {S}.objects(ino, data_version);
CREATE INDEX objects_order ON {S}.objects(substr(path, 1, 2000));
-- Pending-work marks take their number from a sequence, not a counter row: a counter
-- row would serialise every writer on its lock until commit.
CREATE SEQUENCE {S}.pending_seq;
CREATE TABLE {S}.pending(path bytea NOT NULL,
  path_key bytea GENERATED ALWAYS AS (sha256(path)) STORED PRIMARY KEY,
  recursive boolean NOT NULL,
  seq bigint NOT NULL, gen bigint NOT NULL, due bigint NOT NULL, since bigint NOT NULL,
  attempts bigint NOT NULL, last_error text, owner bigint);
CREATE INDEX pending_due ON {S}.pending(due);
CREATE INDEX pending_seq_idx ON {S}.pending(seq);
CREATE TABLE {S}.kv(key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {S}.sessions(id bigserial PRIMARY KEY, host text NOT NULL, pid bigint NOT NULL,
  started bigint NOT NULL, heartbeat bigint NOT NULL);
CREATE TABLE {S}.open_files(ino bigint NOT NULL, session bigint NOT NULL,
  count bigint NOT NULL, PRIMARY KEY(ino, session));
CREATE INDEX open_files_session ON {S}.open_files(session);
CREATE TABLE {S}.locks(ino bigint NOT NULL, session bigint NOT NULL, owner bigint NOT NULL,
  write boolean NOT NULL, start_ bigint NOT NULL, end_ bigint NOT NULL, pid bigint NOT NULL,
  fh bigint NOT NULL);
CREATE INDEX locks_ino ON {S}.locks(ino);
CREATE INDEX locks_session ON {S}.locks(session);
-- The change feed. `xid` is the writing transaction's id (pg_current_xact_id as bigint):
-- readers use it to find changes of transactions that committed after a later one.
CREATE TABLE {S}.changes(seq bigserial PRIMARY KEY, xid bigint NOT NULL,
  session bigint NOT NULL, ts bigint NOT NULL, ino bigint NOT NULL, parent bigint, name bytea);
CREATE INDEX changes_xid ON {S}.changes(xid);
CREATE INDEX changes_ts ON {S}.changes(ts);
CREATE TABLE {S}.wanted(ino bigint PRIMARY KEY, cache bigint NOT NULL, since bigint NOT NULL);

-- A batch expectation: raises DK001 (detail = what) unless ok.
CREATE FUNCTION {S}.deskfs_expect(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION USING ERRCODE = 'DK001',
      MESSAGE = 'deskfs batch expectation failed: ' || what, DETAIL = what;
  END IF;
  RETURN true;
END $f$;

-- Fencing: raises DK002 unless the session is registered.
CREATE FUNCTION {S}.deskfs_fence(ok boolean, session bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION USING ERRCODE = 'DK002',
      MESSAGE = 'deskfs session ' || session || ' is not registered (fenced)',
      DETAIL = session::text;
  END IF;
  RETURN true;
END $f$;

-- n contiguous fresh inode numbers from inode_seq; returns the first. Lock-free: n
-- nextval calls are contiguous unless another session drew a number at the same moment;
-- then they are dropped (numbers are never reused, gaps are harmless) and drawn again.
CREATE FUNCTION {S}.deskfs_alloc_inos(n bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $f$
DECLARE lo bigint; hi bigint;
BEGIN
  IF n IS NULL OR n < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'deskfs_alloc_inos: n must be positive';
  END IF;
  IF n = 1 THEN RETURN nextval('{S}.inode_seq'); END IF;
  FOR attempt IN 1..16 LOOP
    SELECT min(v), max(v) INTO lo, hi
      FROM (SELECT nextval('{S}.inode_seq') AS v FROM generate_series(1, n)) s;
    IF hi - lo = n - 1 THEN RETURN lo; END IF;
  END LOOP;
  RAISE EXCEPTION USING ERRCODE = '40001',
    MESSAGE = 'no contiguous range of ' || n || ' inode numbers after 16 draws (contention)';
END $f$;

-- Open-count change; rows at 0 disappear (one statement for Op::AddOpen / add_open).
CREATE FUNCTION {S}.deskfs_add_open(i bigint, s bigint, d bigint) RETURNS void
LANGUAGE sql VOLATILE AS $f$
  INSERT INTO {S}.open_files(ino, session, count) VALUES (i, s, d)
    ON CONFLICT (ino, session) DO UPDATE SET count = {S}.open_files.count + excluded.count;
  DELETE FROM {S}.open_files WHERE ino = i AND session = s AND count <= 0;
$f$;

-- The change feed: rows logged under the connection's session (deskfs.session, set by
-- log_changes_as) while another session is registered; nothing when alone or unset.
-- deskfs.logged (transaction-local) tells the engine, before COMMIT, that followers
-- are to be woken.
CREATE FUNCTION {S}.deskfs_feed_dentry() RETURNS trigger
LANGUAGE plpgsql AS $f$
DECLARE s bigint; t bigint; x bigint;
BEGIN
  s := nullif(current_setting('deskfs.session', true), '')::bigint;
  IF s IS NULL OR NOT EXISTS (SELECT 1 FROM {S}.sessions WHERE id <> s) THEN
    RETURN NULL;
  END IF;
  t := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  x := pg_current_xact_id()::text::bigint;
  IF TG_OP <> 'INSERT' THEN
    INSERT INTO {S}.changes(xid, session, ts, ino, parent, name)
      VALUES (x, s, t, OLD.ino, OLD.parent, OLD.name);
  END IF;
  IF TG_OP <> 'DELETE' THEN
    INSERT INTO {S}.changes(xid, session, ts, ino, parent, name)
      VALUES (x, s, t, NEW.ino, NEW.parent, NEW.name);
  END IF;
  PERFORM set_config('deskfs.logged', '1', true);
  RETURN NULL;
END $f$;

CREATE FUNCTION {S}.deskfs_feed_inode() RETURNS trigger
LANGUAGE plpgsql AS $f$
DECLARE s bigint; i bigint;
BEGIN
  s := nullif(current_setting('deskfs.session', true), '')::bigint;
  IF s IS NULL OR NOT EXISTS (SELECT 1 FROM {S}.sessions WHERE id <> s) THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'DELETE' THEN i := OLD.ino; ELSE i := NEW.ino; END IF;
  INSERT INTO {S}.changes(xid, session, ts, ino, parent, name)
    VALUES (pg_current_xact_id()::text::bigint, s,
            (extract(epoch FROM clock_timestamp()) * 1000)::bigint, i, NULL, NULL);
  PERFORM set_config('deskfs.logged', '1', true);
  RETURN NULL;
END $f$;

CREATE TRIGGER feed_dentries AFTER INSERT OR UPDATE OR DELETE ON {S}.dentries
  FOR EACH ROW EXECUTE FUNCTION {S}.deskfs_feed_dentry();
-- Attribute changes the kernel can see (not the dirty/local/listed bookkeeping).
CREATE TRIGGER feed_inodes_upd AFTER UPDATE ON {S}.inodes FOR EACH ROW
  WHEN (OLD.size <> NEW.size OR OLD.mtime <> NEW.mtime OR OLD.ctime <> NEW.ctime
        OR OLD.atime <> NEW.atime OR OLD.nlink <> NEW.nlink
        OR OLD.data_version <> NEW.data_version)
  EXECUTE FUNCTION {S}.deskfs_feed_inode();
CREATE TRIGGER feed_inodes_del AFTER DELETE ON {S}.inodes
  FOR EACH ROW EXECUTE FUNCTION {S}.deskfs_feed_inode();
"#;

/// The tables `open` requires.
const TABLES: &[&str] = &[
    "inodes",
    "dentries",
    "xattrs",
    "objects",
    "pending",
    "kv",
    "sessions",
    "open_files",
    "locks",
    "changes",
    "wanted",
];

/// What a schema holds, as far as deskfs is concerned.
pub(super) enum Found {
    /// No schema of that name, or it holds no relation at all.
    Nothing,
    /// Relations that are not a deskfs workspace (detail).
    Foreign(String),
    /// A deskfs workspace of this schema version.
    Deskfs(i64),
}

fn db_err(e: tokio_postgres::Error) -> MetaError {
    super::pool::map_err(&e)
}

/// Looks at schema `schema` (simple queries; works before any table exists).
pub(super) async fn inspect(client: &Client, schema: &str) -> Result<Found> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
                    (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                      WHERE n.nspname = $1),
                    to_regclass(format('%I.kv', $1::text)) IS NOT NULL",
            &[&schema],
        )
        .await
        .map_err(db_err)?;
    let (ns, relations, has_kv): (bool, i64, bool) = (
        row.try_get(0).map_err(db_err)?,
        row.try_get(1).map_err(db_err)?,
        row.try_get(2).map_err(db_err)?,
    );
    if !ns || relations == 0 {
        return Ok(Found::Nothing);
    }
    if !has_kv {
        return Ok(Found::Foreign(format!(
            "schema {schema} holds {relations} relations but no deskfs kv table"
        )));
    }
    let rows = client
        .query(
            &format!(
                "SELECT key, value FROM {schema}.kv WHERE key IN ('format', 'schema_version')"
            ),
            &[],
        )
        .await;
    let rows = match rows {
        Ok(r) => r,
        // A kv table of another shape.
        Err(e) if e.as_db_error().is_some() => {
            return Ok(Found::Foreign(format!(
                "{schema}.kv is not deskfs's: {}",
                super::config::one_line(&e)
            )))
        }
        Err(e) => return Err(db_err(e)),
    };
    let mut format = None;
    let mut version = None;
    for r in rows {
        let k: String = r.try_get(0).map_err(db_err)?;
        let v: String = r.try_get(1).map_err(db_err)?;
        match k.as_str() {
            "format" => format = Some(v),
            _ => version = Some(v),
        }
    }
    if format.as_deref() != Some("deskfs") {
        return Ok(Found::Foreign(format!(
            "{schema}.kv has no deskfs format record"
        )));
    }
    match version.as_deref().map(str::parse::<i64>) {
        Some(Ok(v)) if v >= 1 => Ok(Found::Deskfs(v)),
        other => Ok(Found::Foreign(format!(
            "bad schema_version record {other:?}"
        ))),
    }
}

/// Adds `pending.owner` (the session that marked a row last; see
/// `MetaTxn::due_pending_for`) to a workspace made before it existed: a nullable column
/// without a default, so PostgreSQL changes only the catalog. Looked up first, so an
/// up-to-date schema takes no lock. Errors: [`MetaError::Db`] with the fix when the
/// column is missing and cannot be added (the login does not own the schema's tables).
pub(super) async fn add_pending_owner(client: &Client, schema: &str) -> Result<()> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass(format('%I.pending', $1::text))
                 AND attname = 'owner' AND NOT attisdropped)",
            &[&schema],
        )
        .await
        .map_err(db_err)?;
    let present: bool = row.try_get(0).map_err(db_err)?;
    if present {
        return Ok(());
    }
    let ddl = format!("ALTER TABLE {schema}.pending ADD COLUMN IF NOT EXISTS owner bigint");
    client.batch_execute(&ddl).await.map_err(|e| MetaError::Db {
        code: e.code().map(|c| c.code().to_string()),
        message: format!(
            "cannot add column {schema}.pending.owner ({}); mount once as the role that owns \
             the schema's tables",
            super::config::one_line(&e)
        ),
    })
}

/// Further checks of a deskfs schema of a supported version: every table is there and
/// the root is a directory. `Err(detail)` for a damaged one.
pub(super) async fn check(
    client: &Client,
    schema: &str,
) -> Result<std::result::Result<(), String>> {
    let names: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
    let row = client
        .query_one(
            "SELECT array(SELECT t FROM unnest($2::text[]) t
                          WHERE to_regclass(format('%I.%I', $1::text, t)) IS NULL)",
            &[&schema, &names],
        )
        .await
        .map_err(db_err)?;
    let missing: Vec<String> = row.try_get(0).map_err(db_err)?;
    if !missing.is_empty() {
        return Ok(Err(format!("tables missing: {}", missing.join(", "))));
    }
    let root = client
        .query_opt(
            &format!("SELECT kind FROM {schema}.inodes WHERE ino = $1"),
            &[&(ROOT_INO as i64)],
        )
        .await
        .map_err(db_err)?;
    let kind: Option<i64> = match root {
        Some(r) => r.try_get(0).map_err(db_err)?,
        None => None,
    };
    if kind != Some(4) {
        return Ok(Err("root directory missing".into()));
    }
    Ok(Ok(()))
}

/// Creates the schema's objects and the root directory in one transaction. Errors:
/// [`MetaError::Conflict`] when deskfs tables exist there already (also when another
/// creator won a race), [`MetaError::Db`] otherwise.
pub(super) async fn create(
    client: &Client,
    schema: &str,
    uid: u32,
    gid: u32,
    now_ns: i64,
) -> Result<()> {
    let ddl = DDL.replace("{S}", schema);
    let conflict = |e: tokio_postgres::Error| -> MetaError {
        match e.code().map(|c| c.code()) {
            // duplicate_table, duplicate_function, duplicate_object, unique_violation
            Some("42P07") | Some("42723") | Some("42710") | Some("23505") => {
                MetaError::Conflict(format!("schema {schema} already holds deskfs tables"))
            }
            _ => db_err(e),
        }
    };
    client.batch_execute("BEGIN").await.map_err(db_err)?;
    let res = async {
        client
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await
            .map_err(conflict)?;
        client.batch_execute(&ddl).await.map_err(conflict)?;
        client
            .execute(
                &format!(
                    "INSERT INTO {schema}.inodes(ino,kind,perm,uid,gid,rdev,nlink,size,atime,mtime,
                     ctime,btime,data_version,target,local,dirty,listed)
                     VALUES($1,4,$2,$3,$4,0,2,0,$5,$5,$5,$5,0,NULL,0,false,0)"
                ),
                &[
                    &(ROOT_INO as i64),
                    &0o755i64,
                    &i64::from(uid),
                    &i64::from(gid),
                    &now_ns,
                ],
            )
            .await
            .map_err(db_err)?;
        client
            .execute(
                &format!(
                    "INSERT INTO {schema}.kv(key,value) VALUES('format','deskfs'),('schema_version',$1)"
                ),
                &[&SCHEMA_VERSION.to_string()],
            )
            .await
            .map_err(conflict)?;
        Ok::<_, MetaError>(())
    }
    .await;
    match res {
        Ok(()) => client.batch_execute("COMMIT").await.map_err(conflict),
        Err(e) => {
            // The connection is dropped after creation anyway; a failed ROLLBACK changes
            // nothing (the server rolls back when it goes).
            if let Err(re) = client.batch_execute("ROLLBACK").await {
                tracing::debug!(error = %re, "rollback after a failed schema creation");
            }
            Err(e)
        }
    }
}

/// Drops the deskfs workspace in schema `schema`: the whole schema when it is not
/// `public`, else every deskfs object in it. Returns whether there was one. Refuses
/// (`Corrupt`) a schema that holds something else.
pub(super) async fn destroy(client: &Client, schema: &str) -> Result<bool> {
    match inspect(client, schema).await? {
        Found::Nothing => Ok(false),
        Found::Foreign(d) => Err(MetaError::Corrupt {
            path: schema.to_string(),
            detail: format!("not dropped: {d}"),
        }),
        Found::Deskfs(_) => {
            let sql = if schema == "public" {
                format!(
                    "BEGIN;
                     DROP TABLE IF EXISTS {s}.inodes, {s}.dentries, {s}.xattrs, {s}.objects,
                       {s}.pending, {s}.kv, {s}.sessions, {s}.open_files, {s}.locks,
                       {s}.changes, {s}.wanted CASCADE;
                     DROP SEQUENCE IF EXISTS {s}.inode_seq, {s}.pending_seq;
                     DROP FUNCTION IF EXISTS {s}.deskfs_expect, {s}.deskfs_fence,
                       {s}.deskfs_alloc_inos, {s}.deskfs_add_open, {s}.deskfs_feed_dentry,
                       {s}.deskfs_feed_inode CASCADE;
                     COMMIT;",
                    s = schema
                )
            } else {
                format!("DROP SCHEMA {schema} CASCADE")
            };
            client.batch_execute(&sql).await.map_err(db_err)?;
            Ok(true)
        }
    }
}
