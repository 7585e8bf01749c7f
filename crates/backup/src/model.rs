//! The namespace as a backup describes it, in memory: the result of applying a snapshot
//! and its deltas, before it is checked against the bucket and written to a database.

use std::collections::{BTreeMap, HashMap};

use deskfs_meta::{Ino, Kind, ObjectRow, ROOT_INO};

use crate::codec::{InodeRec, Record};

/// The xattrs of one inode: `(name, value)` pairs, sorted by name.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Inodes, entries, xattrs and recorded objects.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Inodes by number.
    pub inodes: BTreeMap<Ino, InodeRec>,
    /// Entries: `(parent, name) -> ino`.
    pub dentries: BTreeMap<(Ino, Vec<u8>), Ino>,
    /// Xattrs by inode.
    pub xattrs: HashMap<Ino, Xattrs>,
    /// Recorded objects by workspace path.
    pub objects: BTreeMap<Vec<u8>, ObjectRow>,
}

impl Model {
    /// Applies one record (later records win).
    pub fn apply(&mut self, r: Record) {
        match r {
            Record::Inode(n) => {
                self.inodes.insert(n.ino, n);
            }
            Record::InodeGone(ino) => {
                self.inodes.remove(&ino);
                self.xattrs.remove(&ino);
            }
            Record::Dentry { parent, name, ino } => {
                self.dentries.insert((parent, name), ino);
            }
            Record::DentryGone { parent, name } => {
                self.dentries.remove(&(parent, name));
            }
            Record::Xattrs { ino, attrs } => {
                if attrs.is_empty() {
                    self.xattrs.remove(&ino);
                } else {
                    self.xattrs.insert(ino, attrs);
                }
            }
            Record::Object(o) => {
                self.objects.insert(o.path.clone(), o);
            }
            Record::ObjectGone(p) => {
                self.objects.remove(&p);
            }
        }
    }

    /// Keeps only what is reachable from the root through entries whose inodes exist
    /// and whose names a directory can hold ([`is_file_name`])
    /// (an open-but-unlinked file, or an entry left by a torn record set, is dropped),
    /// then sets every link count from the entries: files = number of names,
    /// directories = 2 + subdirectories (POSIX, as ext4 counts them).
    /// Returns the workspace path of every kept inode's first name, for reports.
    pub fn prune_and_count(&mut self) -> HashMap<Ino, Vec<u8>> {
        let mut children: HashMap<Ino, Vec<(Vec<u8>, Ino)>> = HashMap::new();
        for ((p, n), i) in &self.dentries {
            children.entry(*p).or_default().push((n.clone(), *i));
        }
        let mut path_of: HashMap<Ino, Vec<u8>> = HashMap::new();
        let mut keep_dentries = BTreeMap::new();
        if self.inodes.get(&ROOT_INO).map(|r| r.kind) == Some(Kind::Dir) {
            path_of.insert(ROOT_INO, Vec::new());
            let mut stack = vec![ROOT_INO];
            while let Some(dir) = stack.pop() {
                let base = path_of.get(&dir).cloned().unwrap_or_default();
                for (name, ino) in children.remove(&dir).unwrap_or_default() {
                    if !is_file_name(&name) {
                        continue; // no file system could hold it (a forged or broken file)
                    }
                    let Some(rec) = self.inodes.get(&ino) else {
                        continue;
                    };
                    let is_dir = rec.kind == Kind::Dir;
                    if is_dir && path_of.contains_key(&ino) {
                        continue; // a directory has one name; a cycle or second name is dropped
                    }
                    let mut p = base.clone();
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&name);
                    keep_dentries.insert((dir, name), ino);
                    if let std::collections::hash_map::Entry::Vacant(e) = path_of.entry(ino) {
                        e.insert(p);
                        if is_dir {
                            stack.push(ino);
                        }
                    }
                }
            }
        }
        self.dentries = keep_dentries;
        self.inodes.retain(|ino, _| path_of.contains_key(ino));
        self.xattrs.retain(|ino, _| path_of.contains_key(ino));
        self.recount();
        path_of
    }

    /// Sets link counts from the entries.
    pub fn recount(&mut self) {
        let mut names: HashMap<Ino, u32> = HashMap::new();
        let mut subdirs: HashMap<Ino, u32> = HashMap::new();
        for ((p, _), i) in &self.dentries {
            *names.entry(*i).or_default() += 1;
            if self.inodes.get(i).map(|r| r.kind) == Some(Kind::Dir) {
                *subdirs.entry(*p).or_default() += 1;
            }
        }
        for (ino, r) in self.inodes.iter_mut() {
            r.nlink = if r.kind == Kind::Dir {
                2 + subdirs.get(ino).copied().unwrap_or(0)
            } else {
                names.get(ino).copied().unwrap_or(0)
            };
        }
    }
}

/// Whether `name` can be one entry of a directory (POSIX: not empty, `.` or `..`, no `/`
/// or NUL byte; at most 255 bytes, Linux `NAME_MAX`).
pub fn is_file_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != b"."
        && name != b".."
        && !name.iter().any(|&b| b == b'/' || b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode(ino: Ino, kind: Kind) -> Record {
        Record::Inode(InodeRec {
            ino,
            kind,
            perm: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            nlink: 1,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            btime_ns: 0,
            data_version: 0,
            target: None,
        })
    }

    #[test]
    fn entries_no_directory_could_hold_are_dropped() {
        let mut m = Model::default();
        m.apply(inode(ROOT_INO, Kind::Dir));
        let long = vec![b'n'; 256];
        let bad: [&[u8]; 7] = [b"", b".", b"..", b"/", b"a/b", b"a\0b", &long];
        for (i, name) in bad.iter().enumerate() {
            let ino = 100 + i as Ino;
            m.apply(inode(ino, Kind::File));
            m.apply(Record::Dentry {
                parent: ROOT_INO,
                name: name.to_vec(),
                ino,
            });
        }
        m.apply(inode(200, Kind::File));
        m.apply(Record::Dentry {
            parent: ROOT_INO,
            name: vec![b'n'; 255],
            ino: 200,
        });
        let paths = m.prune_and_count();
        assert_eq!(m.dentries.len(), 1, "{:?}", m.dentries.keys());
        assert_eq!(paths.get(&200), Some(&vec![b'n'; 255]));
        assert_eq!(m.inodes.len(), 2, "the root and the one named file");
    }
}
