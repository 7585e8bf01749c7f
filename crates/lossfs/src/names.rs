//! A namespace: which inode each name of each directory points at, and the names of each
//! inode. No attributes, no data. lossfs keeps two of them over the same inode numbers:
//! the volatile one (what the mount shows) and the durable one (what the backing
//! directory holds), so an inode's path in the backing directory is always known.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Inode number of the root directory.
pub(crate) const ROOT: u64 = 1;

#[derive(Debug, Default)]
struct Node {
    dir: bool,
    /// Entries of a directory, by name.
    children: BTreeMap<Vec<u8>, u64>,
    /// The names of this inode: (parent, name); the root has none.
    links: Vec<(u64, Vec<u8>)>,
}

/// Directory entries and inode names, by inode number.
#[derive(Debug)]
pub(crate) struct Names {
    nodes: HashMap<u64, Node>,
}

impl Names {
    /// A namespace with an empty root directory.
    pub(crate) fn new() -> Names {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                dir: true,
                ..Node::default()
            },
        );
        Names { nodes }
    }

    /// The inode `name` in directory `parent` points at.
    pub(crate) fn lookup(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.nodes.get(&parent)?.children.get(name).copied()
    }

    /// Whether `ino` is a directory of this namespace (has a name, or is the root).
    pub(crate) fn is_dir(&self, ino: u64) -> bool {
        self.nodes.get(&ino).is_some_and(|n| n.dir)
    }

    /// Whether `ino` has a name here (the root always has).
    pub(crate) fn contains(&self, ino: u64) -> bool {
        self.nodes.contains_key(&ino)
    }

    /// Number of names of `ino`.
    pub(crate) fn nlink(&self, ino: u64) -> usize {
        self.nodes.get(&ino).map_or(0, |n| n.links.len())
    }

    /// Number of subdirectories of directory `ino`.
    pub(crate) fn subdirs(&self, ino: u64) -> usize {
        self.nodes.get(&ino).map_or(0, |n| {
            n.children
                .values()
                .filter(|c| self.nodes.get(c).is_some_and(|c| c.dir))
                .count()
        })
    }

    /// The entries of directory `ino`, in name order.
    pub(crate) fn children(&self, ino: u64) -> Vec<(Vec<u8>, u64)> {
        self.nodes.get(&ino).map_or_else(Vec::new, |n| {
            n.children.iter().map(|(k, v)| (k.clone(), *v)).collect()
        })
    }

    /// Whether directory `ino` has no entries.
    pub(crate) fn is_empty_dir(&self, ino: u64) -> bool {
        self.nodes.get(&ino).is_some_and(|n| n.children.is_empty())
    }

    /// The parent of `ino` through its first name (the root is its own parent).
    pub(crate) fn parent(&self, ino: u64) -> Option<u64> {
        if ino == ROOT {
            return Some(ROOT);
        }
        self.nodes.get(&ino)?.links.first().map(|l| l.0)
    }

    /// The path of `ino` relative to the root through its first names (`""` for the
    /// root); `None` if it has no name.
    pub(crate) fn path(&self, ino: u64) -> Option<PathBuf> {
        let mut parts = Vec::new();
        let mut cur = ino;
        let mut guard = 0usize;
        while cur != ROOT {
            let (p, name) = self.nodes.get(&cur)?.links.first()?;
            parts.push(name.as_slice());
            cur = *p;
            guard += 1;
            if guard > 4096 {
                return None;
            }
        }
        let mut out = PathBuf::new();
        for part in parts.iter().rev() {
            out.push(OsStr::from_bytes(part));
        }
        Some(out)
    }

    /// Whether `anc` is `ino` or one of its ancestors.
    pub(crate) fn is_ancestor(&self, anc: u64, ino: u64) -> bool {
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == anc {
                return true;
            }
            if cur == ROOT {
                return false;
            }
            match self.parent(cur) {
                Some(p) => cur = p,
                None => return false,
            }
        }
        false
    }

    /// Adds the name `parent/name` for `ino` (creating the node on its first name). The
    /// caller has checked that `parent` is a directory without that name.
    pub(crate) fn insert(&mut self, parent: u64, name: &[u8], ino: u64, dir: bool) {
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.insert(name.to_vec(), ino);
        }
        let node = self.nodes.entry(ino).or_insert_with(|| Node {
            dir,
            ..Node::default()
        });
        node.links.push((parent, name.to_vec()));
    }

    /// Removes the name `parent/name`; the node goes with its last name (a directory's
    /// entries with it: the caller removes only empty directories). Returns the inode.
    pub(crate) fn remove(&mut self, parent: u64, name: &[u8]) -> Option<u64> {
        let ino = self.nodes.get_mut(&parent)?.children.remove(name)?;
        if let Some(node) = self.nodes.get_mut(&ino) {
            if let Some(i) = node
                .links
                .iter()
                .position(|(p, n)| *p == parent && n.as_slice() == name)
            {
                node.links.remove(i);
            }
            if node.links.is_empty() && ino != ROOT {
                self.nodes.remove(&ino);
            }
        }
        Some(ino)
    }

    /// Moves `parent/name` to `newparent/newname`, replacing what was there (a replaced
    /// directory must be empty: the caller checked). Returns the replaced inode.
    pub(crate) fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
    ) -> Option<u64> {
        let ino = self.lookup(parent, name)?;
        if self.lookup(newparent, newname) == Some(ino) {
            // Two names of one inode (or the same name): rename does nothing.
            return None;
        }
        let replaced = self.remove(newparent, newname);
        let dir = self.is_dir(ino);
        // Keep the node alive while it has no name: add the new name first.
        self.insert(newparent, newname, ino, dir);
        self.remove(parent, name);
        replaced
    }

    /// Swaps the inodes of two names (`RENAME_EXCHANGE`); both exist.
    pub(crate) fn exchange(&mut self, parent: u64, name: &[u8], newparent: u64, newname: &[u8]) {
        let (Some(a), Some(b)) = (self.lookup(parent, name), self.lookup(newparent, newname))
        else {
            return;
        };
        if a == b {
            return;
        }
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children.insert(name.to_vec(), b);
        }
        if let Some(p) = self.nodes.get_mut(&newparent) {
            p.children.insert(newname.to_vec(), a);
        }
        for (ino, (op, on), (np, nn)) in [
            (a, (parent, name), (newparent, newname)),
            (b, (newparent, newname), (parent, name)),
        ] {
            if let Some(node) = self.nodes.get_mut(&ino) {
                if let Some(l) = node
                    .links
                    .iter_mut()
                    .find(|(p, n)| *p == op && n.as_slice() == on)
                {
                    *l = (np, nn.to_vec());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_rename_remove() {
        let mut n = Names::new();
        n.insert(ROOT, b"d", 2, true);
        n.insert(2, b"f", 3, false);
        assert_eq!(n.path(3), Some(PathBuf::from("d/f")));
        n.insert(ROOT, b"g", 3, false);
        assert_eq!(n.nlink(3), 2);
        n.insert(ROOT, b"h", 4, false);
        assert_eq!(n.rename(2, b"f", ROOT, b"h"), Some(4));
        assert!(!n.contains(4));
        assert_eq!(n.lookup(ROOT, b"h"), Some(3));
        assert_eq!(n.nlink(3), 2);
        assert_eq!(n.remove(ROOT, b"g"), Some(3));
        assert_eq!(n.path(3), Some(PathBuf::from("h")));
        assert!(n.is_empty_dir(2));
        assert_eq!(n.subdirs(ROOT), 1);
        assert!(n.is_ancestor(ROOT, 3));
        assert!(!n.is_ancestor(2, 3));
    }

    #[test]
    fn exchange_swaps() {
        let mut n = Names::new();
        n.insert(ROOT, b"a", 2, false);
        n.insert(ROOT, b"d", 3, true);
        n.insert(3, b"b", 4, false);
        n.exchange(ROOT, b"a", 3, b"b");
        assert_eq!(n.path(2), Some(PathBuf::from("d/b")));
        assert_eq!(n.path(4), Some(PathBuf::from("a")));
    }
}
