//! Recency bookkeeping of evictable data (blocks and clean staging files).

use std::collections::{BTreeMap, HashMap};

use crate::BlockKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Item {
    Block(BlockKey),
    Staging(u64),
}

#[derive(Default)]
pub(crate) struct Lru {
    tick: u64,
    by_item: HashMap<Item, (u64, u64)>, // item -> (bytes, tick)
    by_tick: BTreeMap<u64, Item>,
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
            Item::Block(_) => self.block_bytes += bytes,
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

    pub(crate) fn blocks_of(&self, ino: u64) -> Vec<BlockKey> {
        self.by_item
            .keys()
            .filter_map(|i| match i {
                Item::Block(k) if k.ino == ino => Some(*k),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn block_count(&self) -> usize {
        self.by_item
            .keys()
            .filter(|i| matches!(i, Item::Block(_)))
            .count()
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
        let victims: Vec<(u64, Item)> = self
            .by_tick
            .iter()
            .filter(|(_, i)| matches!(i, Item::Block(_)))
            .map(|(t, i)| (*t, *i))
            .collect();
        for (_, item) in victims {
            if self.block_bytes + self.staging_bytes <= cap {
                break;
            }
            if let Item::Block(k) = item {
                self.forget(item);
                out.push(k);
            }
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
