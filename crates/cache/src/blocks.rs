//! The block cache: fixed-size blocks of bucket objects, one file per block.

use std::io::Write;
use std::path::PathBuf;

use crate::{Cache, CacheError, Result};

/// Identity of one cached block: inode, content version, block index
/// (`index * block_size` is its offset in the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockKey {
    /// Inode number.
    pub ino: u64,
    /// Content version of the inode the block belongs to.
    pub version: u64,
    /// Block index.
    pub index: u64,
}

impl Cache {
    pub(crate) fn block_path(&self, k: &BlockKey) -> PathBuf {
        self.blocks
            .join(format!("{:02x}", k.ino & 0xff))
            .join(format!("{}.{}.{}", k.ino, k.version, k.index))
    }

    pub(crate) fn index_blocks(&self) -> Result<()> {
        let rd = match std::fs::read_dir(&self.blocks) {
            Ok(rd) => rd,
            Err(e) => return Err(CacheError::io(&self.blocks, e)),
        };
        let mut found = Vec::new();
        for sub in rd.flatten() {
            let Ok(files) = std::fs::read_dir(sub.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name();
                let Some(name) = name.to_str() else { continue };
                let parts: Vec<&str> = name.split('.').collect();
                let parsed = match parts.as_slice() {
                    [a, b, c] => (|| {
                        Some(BlockKey {
                            ino: a.parse().ok()?,
                            version: b.parse().ok()?,
                            index: c.parse().ok()?,
                        })
                    })(),
                    _ => None,
                };
                let Ok(md) = f.metadata() else { continue };
                match parsed {
                    Some(k) => {
                        let t = md
                            .modified()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map(|d| d.as_nanos())
                            .unwrap_or(0);
                        found.push((t, k, md.len()));
                    }
                    None => {
                        // Temp files of an interrupted write.
                        let _ = std::fs::remove_file(f.path());
                    }
                }
            }
        }
        found.sort();
        let mut lru = self.lru_lock();
        for (_, k, len) in found {
            lru.touch_block(k, len);
        }
        Ok(())
    }

    /// Forgets and deletes every cached block (temp files of interrupted writes too);
    /// returns how many blocks were indexed. Blocks are written without a flush (a temp
    /// file renamed into place), so after a crash of the machine one may be short or
    /// hold zeros: a mount that finds the last one ended without a clean shutdown calls
    /// this before serving. Errors: the blocks directory cannot be read or a file
    /// cannot be removed (`EIO`).
    pub fn drop_all_blocks(&self) -> Result<usize> {
        let dropped = {
            let mut lru = self.lru_lock();
            let keys = lru.all_blocks();
            for k in &keys {
                lru.forget_block(*k);
            }
            keys.len()
        };
        let rd = match std::fs::read_dir(&self.blocks) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dropped),
            Err(e) => return Err(CacheError::io(&self.blocks, e)),
        };
        for sub in rd {
            let sub = sub.map_err(|e| CacheError::io(&self.blocks, e))?.path();
            if sub.is_dir() {
                std::fs::remove_dir_all(&sub).map_err(|e| CacheError::io(&sub, e))?;
            }
        }
        Ok(dropped)
    }

    /// Whether a block is cached (no recency update).
    pub fn has_block(&self, k: &BlockKey) -> bool {
        self.lru_lock().has_block(*k)
    }

    /// Reads a cached block, or `None` on a miss.
    pub fn read_block(&self, k: &BlockKey) -> Result<Option<Vec<u8>>> {
        if !self.lru_lock().refresh_block(*k) {
            return Ok(None);
        }
        let p = self.block_path(k);
        match std::fs::read(&p) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.lru_lock().forget_block(*k);
                Ok(None)
            }
            Err(e) => Err(CacheError::io(&p, e)),
        }
    }

    /// Reads bytes `from..to` of a cached block (fewer at its end); `None` when the
    /// block is not cached. A reader asking for part of a block (the kernel reads 128 KiB
    /// at a time) reads only that part.
    pub fn read_block_range(&self, k: &BlockKey, from: u64, to: u64) -> Result<Option<Vec<u8>>> {
        if !self.lru_lock().refresh_block(*k) {
            return Ok(None);
        }
        let p = self.block_path(k);
        let f = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.lru_lock().forget_block(*k);
                return Ok(None);
            }
            Err(e) => return Err(CacheError::io(&p, e)),
        };
        // Read into spare capacity (no zero-fill of a buffer about to be overwritten).
        use std::io::{Read, Seek, SeekFrom};
        let want = to.saturating_sub(from);
        let mut buf = Vec::with_capacity(want as usize);
        let mut f = f;
        f.seek(SeekFrom::Start(from))
            .and_then(|_| f.take(want).read_to_end(&mut buf))
            .map_err(|e| CacheError::io(&p, e))?;
        Ok(Some(buf))
    }

    /// Stores a block (written to a temp file, then renamed into place, so a crash never
    /// leaves a partial block) and evicts old blocks when over the cap.
    pub fn write_block(&self, k: &BlockKey, data: &[u8]) -> Result<()> {
        let p = self.block_path(k);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).map_err(|e| CacheError::io(dir, e))?;
        }
        let tmp = p.with_extension(format!("{}.tmp{}", k.index, std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| CacheError::io(&tmp, e))?;
        f.write_all(data).map_err(|e| CacheError::io(&tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, &p).map_err(|e| CacheError::io(&p, e))?;
        self.lru_lock().touch_block(*k, data.len() as u64);
        let _ = self.over_capacity();
        Ok(())
    }

    /// Drops one cached block.
    pub fn drop_block(&self, k: &BlockKey) {
        if self.lru_lock().forget_block(*k) {
            let _ = std::fs::remove_file(self.block_path(k));
        }
    }

    /// Drops every cached block of `ino` (all versions).
    pub fn drop_blocks(&self, ino: u64) {
        let keys = {
            let mut lru = self.lru_lock();
            let keys = lru.blocks_of(ino);
            for k in &keys {
                lru.forget_block(*k);
            }
            keys
        };
        for k in keys {
            let _ = std::fs::remove_file(self.block_path(&k));
        }
    }
}
