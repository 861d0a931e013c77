//! The on-disk cubin cache: a kernel family compiled once per machine, not
//! once per process.
//!
//! A cubin is stored under the cache key of its source, architecture and
//! NVRTC version (`towers_kernels::cuda::cache_key`), in the folder
//! [`CubinCache::default_dir`] picks: `$TOWERS_CUBIN_CACHE` when set (an
//! empty value turns the disk cache off), else `$XDG_CACHE_HOME/towers/cubin`,
//! else `~/.cache/towers/cubin`.
//!
//! Invariants:
//! - **Never a wrong cubin.** A file holds a magic tag, the key, the image
//!   length and an FNV-1a 64 checksum of the image before the image; a file
//!   whose header or checksum disagrees (truncated, corrupted, another key)
//!   is ignored and rewritten, never loaded.
//! - **Never a half-written file.** An image is written to a temporary file
//!   in the same folder and renamed over the final name (atomic on POSIX),
//!   so concurrent processes (MPI ranks on one host) read either nothing or
//!   a whole file; two writers of one key write identical bytes.
//! - **A cache, not a dependency.** Any I/O failure (read-only home, full
//!   disk) makes the cache miss or skip the write; compilation then goes on
//!   as without a cache. Only [`CubinCache::get`] and [`CubinCache::put`]
//!   touch the disk, at load time: a training step never does.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The first 8 bytes of every cache file.
const MAGIC: &[u8; 8] = b"TWRCUBN1";
/// Magic, key, length, checksum.
const HEADER: usize = 8 + 8 + 8 + 8;

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A folder of cubins by cache key (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinCache {
    dir: PathBuf,
}

impl CubinCache {
    /// A cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> CubinCache {
        CubinCache { dir: dir.into() }
    }

    /// The folder the environment asks for, or `None` when the disk cache
    /// is off (`TOWERS_CUBIN_CACHE=""`) or no home folder is known.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(d) = std::env::var_os("TOWERS_CUBIN_CACHE") {
            return (!d.is_empty()).then(|| PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return Some(Path::new(&d).join("towers").join("cubin"));
        }
        std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|h| Path::new(&h).join(".cache/towers/cubin"))
    }

    /// The cache the environment asks for, if any.
    pub fn from_env() -> Option<CubinCache> {
        CubinCache::default_dir().map(CubinCache::new)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of a key.
    pub fn path(&self, key: u64, arch: &str) -> PathBuf {
        self.dir.join(format!("{key:016x}-{arch}.cubin"))
    }

    /// The cubin stored under `key`, if a whole, unaltered one is there.
    pub fn get(&self, key: u64, arch: &str) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.path(key, arch)).ok()?;
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let (stored_key, len, sum) = (word(8), word(16) as usize, word(24));
        let image = &bytes[HEADER..];
        (stored_key == key && image.len() == len && fnv1a64(image) == sum).then(|| image.to_vec())
    }

    /// Store `image` under `key` (atomically; see the module docs). An error
    /// only says why nothing was stored; callers may ignore it.
    pub fn put(&self, key: u64, arch: &str, image: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key, arch);
        let tmp = self.dir.join(format!(".{key:016x}-{arch}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&key.to_le_bytes());
        header.extend_from_slice(&(image.len() as u64).to_le_bytes());
        header.extend_from_slice(&fnv1a64(image).to_le_bytes());
        let written = f.write_all(&header).and_then(|_| f.write_all(image)).and_then(|_| f.sync_all());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_cubin_comes_back_and_an_altered_one_never_does() {
        let dir = tempfile::tempdir().unwrap();
        let c = CubinCache::new(dir.path().join("cubin"));
        assert_eq!(c.get(7, "sm_90"), None, "empty cache");
        let image: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        c.put(7, "sm_90", &image).unwrap();
        assert_eq!(c.get(7, "sm_90").as_deref(), Some(&image[..]));
        assert_eq!(c.get(7, "sm_80"), None, "another architecture is another file");
        assert_eq!(c.get(8, "sm_90"), None, "another key");

        // Corrupt one byte of the image: ignored.
        let p = c.path(7, "sm_90");
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(c.get(7, "sm_90"), None, "checksum mismatch");
        // Truncated: ignored.
        std::fs::write(&p, &bytes[..HEADER + 10]).unwrap();
        assert_eq!(c.get(7, "sm_90"), None, "length mismatch");
        // A file of another key under this name: ignored.
        c.put(9, "sm_90", &image).unwrap();
        std::fs::rename(c.path(9, "sm_90"), &p).unwrap();
        assert_eq!(c.get(7, "sm_90"), None, "key mismatch");
        // Rewritten: back.
        c.put(7, "sm_90", &image).unwrap();
        assert_eq!(c.get(7, "sm_90").as_deref(), Some(&image[..]));
        // No temporary file is left behind.
        let names: Vec<String> =
            std::fs::read_dir(c.dir()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert!(names.iter().all(|n| n.ends_with(".cubin") && !n.starts_with('.')), "{names:?}");
    }

    #[test]
    fn an_unwritable_folder_is_a_miss_not_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-folder");
        std::fs::write(&file, b"x").unwrap();
        let c = CubinCache::new(file.join("cubin"));
        assert!(c.put(1, "sm_90", b"abc").is_err());
        assert_eq!(c.get(1, "sm_90"), None);
    }
}
