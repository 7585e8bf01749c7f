//! Recency bookkeeping of evictable data (blocks and clean staging files).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::BlockKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Item {
    Block(BlockKey),
    Staging(u64),
}

/// Every operation is O(log n) in the items held, or O(what it returns): a close's
/// `drop_blocks` runs on the request path, and a workspace may hold a million clean files.
#[derive(Default)]
pub(crate) struct Lru {
    tick: u64,
    by_item: HashMap<Item, (u64, u64)>, // item -> (bytes, tick)
    by_tick: BTreeMap<u64, Item>,
    /// The block items, in (inode, version, index) order: an inode's blocks are one range.
    blocks: BTreeSet<BlockKey>,
    pub(crate) block_bytes: u64,
    pub(crate) staging_bytes: u64,
}

impl Lru {
    fn touch(&mut self, item: Item, bytes: u64) {
        self.tick += 1;
        let t = self.tick;
        if let Some((old_bytes, old_tick)) = self.by_item.insert(item, (bytes, t)) {
            self.by_tick.remove(&old_tick);
            self.sub(item, old_bytes);
        }
        self.by_tick.insert(t, item);
        match item {
            Item::Block(k) => {
                self.blocks.insert(k);
                self.block_bytes += bytes
            }
            Item::Staging(_) => self.staging_bytes += bytes,
        }
    }

    fn sub(&mut self, item: Item, bytes: u64) {
        match item {
            Item::Block(_) => self.block_bytes = self.block_bytes.saturating_sub(bytes),
            Item::Staging(_) => self.staging_bytes = self.staging_bytes.saturating_sub(bytes),
        }
    }

    fn forget(&mut self, item: Item) -> bool {
        if let Some((bytes, tick)) = self.by_item.remove(&item) {
            self.by_tick.remove(&tick);
            if let Item::Block(k) = item {
                self.blocks.remove(&k);
            }
            self.sub(item, bytes);
            true
        } else {
            false
        }
    }

    pub(crate) fn touch_block(&mut self, k: BlockKey, bytes: u64) {
        self.touch(Item::Block(k), bytes);
    }

    pub(crate) fn refresh_block(&mut self, k: BlockKey) -> bool {
        match self.by_item.get(&Item::Block(k)) {
            Some(&(bytes, _)) => {
                self.touch(Item::Block(k), bytes);
                true
            }
            None => false,
        }
    }

    pub(crate) fn has_block(&self, k: BlockKey) -> bool {
        self.by_item.contains_key(&Item::Block(k))
    }

    pub(crate) fn forget_block(&mut self, k: BlockKey) -> bool {
        self.forget(Item::Block(k))
    }

    /// The blocks of inode `ino`, every content version.
    pub(crate) fn blocks_of(&self, ino: u64) -> Vec<BlockKey> {
        let lo = BlockKey {
            ino,
            version: 0,
            index: 0,
        };
        let hi = BlockKey {
            ino,
            version: u64::MAX,
            index: u64::MAX,
        };
        self.blocks.range(lo..=hi).copied().collect()
    }

    /// Every block held.
    pub(crate) fn all_blocks(&self) -> Vec<BlockKey> {
        self.blocks.iter().copied().collect()
    }

    pub(crate) fn block_count(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn touch_staging(&mut self, ino: u64, bytes: u64) {
        self.touch(Item::Staging(ino), bytes);
    }

    pub(crate) fn refresh_staging(&mut self, ino: u64) {
        if let Some(&(bytes, _)) = self.by_item.get(&Item::Staging(ino)) {
            self.touch(Item::Staging(ino), bytes);
        }
    }

    pub(crate) fn forget_staging(&mut self, ino: u64) {
        self.forget(Item::Staging(ino));
    }

    /// Evicts least-recently-used blocks while total evictable bytes exceed `cap`,
    /// returning the evicted keys (files to delete).
    pub(crate) fn evict_blocks(&mut self, cap: u64) -> Vec<BlockKey> {
        let mut out = Vec::new();
        if self.block_bytes + self.staging_bytes <= cap {
            return out;
        }
        // The oldest blocks whose bytes bring the total under the cap, then forgotten.
        let mut total = self.block_bytes + self.staging_bytes;
        for item in self.by_tick.values() {
            if total <= cap {
                break;
            }
            if let Item::Block(k) = item {
                if let Some(&(bytes, _)) = self.by_item.get(item) {
                    total = total.saturating_sub(bytes);
                    out.push(*k);
                }
            }
        }
        for k in &out {
            self.forget(Item::Block(*k));
        }
        out
    }

    /// Clean staging files to evict (oldest first) to get under `cap`.
    pub(crate) fn staging_victims(&self, cap: u64) -> Vec<u64> {
        let mut total = self.block_bytes + self.staging_bytes;
        let mut out = Vec::new();
        for item in self.by_tick.values() {
            if total <= cap {
                break;
            }
            if let Item::Staging(ino) = item {
                if let Some(&(bytes, _)) = self.by_item.get(item) {
                    total = total.saturating_sub(bytes);
                    out.push(*ino);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    fn key(ino: u64, version: u64, index: u64) -> BlockKey {
        BlockKey {
            ino,
            version,
            index,
        }
    }

    #[test]
    fn an_inodes_blocks_are_found_across_versions_and_forgotten_with_it() {
        let mut l = Lru::default();
        for (ino, v, i) in [(7, 1, 0), (7, 1, 1), (7, 2, 0), (6, 9, 9), (8, 0, 0)] {
            l.touch_block(key(ino, v, i), 10);
        }
        l.touch_staging(7, 100);
        assert_eq!(
            l.blocks_of(7),
            [key(7, 1, 0), key(7, 1, 1), key(7, 2, 0)],
            "every version of inode 7, no other inode, no staging file"
        );
        assert_eq!(l.block_count(), 5);
        for k in l.blocks_of(7) {
            assert!(l.forget_block(k));
        }
        assert!(l.blocks_of(7).is_empty());
        assert_eq!(l.block_count(), 2);
        assert_eq!((l.block_bytes, l.staging_bytes), (20, 100));
        assert_eq!(l.blocks_of(u64::MAX), []);
    }

    #[test]
    fn eviction_takes_the_oldest_blocks_until_under_the_cap() {
        let mut l = Lru::default();
        l.touch_block(key(1, 1, 0), 10);
        l.touch_staging(2, 10);
        l.touch_block(key(3, 1, 0), 10);
        l.touch_block(key(4, 1, 0), 10);
        assert!(l.refresh_block(key(1, 1, 0)), "block 1 is now the newest");
        assert!(l.evict_blocks(40).is_empty(), "at the cap: nothing");
        assert_eq!(l.evict_blocks(25), [key(3, 1, 0), key(4, 1, 0)]);
        assert_eq!(l.block_count(), 1);
        assert!(l.has_block(key(1, 1, 0)));
        assert_eq!((l.block_bytes, l.staging_bytes), (10, 10));
        assert_eq!(
            l.staging_victims(5),
            [2],
            "staging files are the VFS's to evict"
        );
    }
}
