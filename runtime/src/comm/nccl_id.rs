//! Passing an NCCL unique id from rank 0 to every rank, before an NCCL
//! communicator can exist (`cuda::nccl`): over an existing [`Comm`] (MPI
//! under a launcher, threads in tests) or, for launches without MPI, through
//! a file that rank 0 writes and every other rank waits for.
//!
//! The id is 128 opaque bytes ([`ID_BYTES`], NCCL's `ncclUniqueId`). Over a
//! `Comm`, whose collectives carry `f32`, each byte travels as the f32 value
//! `0.0..=255.0`, which every f32 holds exactly; a received value that is
//! not such an integer is an error, never a silently different id. Through a
//! file, rank 0 writes the 128 bytes to a temporary name and renames it into
//! place, so a reader never sees a partial id; readers poll until it exists
//! or their timeout passes. This module needs no NCCL library: the id comes
//! from the caller.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::{Comm, CommError};

/// Bytes of an NCCL unique id (`ncclUniqueId`).
pub const ID_BYTES: usize = 128;

/// Why an NCCL id could not be passed.
#[derive(Debug, Error)]
pub enum NcclIdError {
    #[error("passing the NCCL id over the communicator failed: {0}")]
    Comm(#[from] CommError),
    #[error("rank {rank}: received an NCCL id whose byte {index} arrived as {value}, not an integer 0..=255: the ranks' communicator corrupted it")]
    Corrupt { rank: usize, index: usize, value: f32 },
    #[error("rank 0 could not make an NCCL id: {0}")]
    Make(String),
    #[error("NCCL id file {path}: {detail}")]
    File { path: PathBuf, detail: String },
    #[error("NCCL id file {path} did not appear within {waited:?}: did rank 0 start, and does every rank see the same path?")]
    Timeout { path: PathBuf, waited: Duration },
}

/// Rank 0's id (made by `make`, called on rank 0 only) on every rank of
/// `comm`, through [`Comm::broadcast`]. Collective: every rank calls it.
pub fn exchange_id(
    comm: &dyn Comm,
    make: impl FnOnce() -> Result<[u8; ID_BYTES], String>,
) -> Result<[u8; ID_BYTES], NcclIdError> {
    let mut wire = [0f32; ID_BYTES];
    // Rank 0 makes the id before the broadcast; a failure must not leave
    // the other ranks waiting in it, so rank 0 still joins the broadcast
    // (with an all-NaN id the others refuse) and reports its error after.
    let made = if comm.rank() == 0 {
        let made = make();
        match &made {
            Ok(id) => wire.iter_mut().zip(id).for_each(|(w, &b)| *w = f32::from(b)),
            Err(_) => wire.fill(f32::NAN),
        }
        Some(made)
    } else {
        None
    };
    comm.broadcast(0, &mut [&mut wire[..]])?;
    if let Some(Err(e)) = made {
        return Err(NcclIdError::Make(e));
    }
    decode(comm.rank(), &wire)
}

/// The bytes of an id received as f32 values.
fn decode(rank: usize, wire: &[f32; ID_BYTES]) -> Result<[u8; ID_BYTES], NcclIdError> {
    let mut id = [0u8; ID_BYTES];
    for (index, (b, &v)) in id.iter_mut().zip(wire).enumerate() {
        if !(0.0..=255.0).contains(&v) || v.fract() != 0.0 {
            return Err(NcclIdError::Corrupt { rank, index, value: v });
        }
        *b = v as u8;
    }
    Ok(id)
}

/// Write `id` to `path` atomically (a temporary file beside it, then a
/// rename): rank 0 of a launch without MPI.
pub fn write_id_file(path: &Path, id: &[u8; ID_BYTES]) -> Result<(), NcclIdError> {
    let err = |detail: String| NcclIdError::File { path: path.to_path_buf(), detail };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, id).map_err(|e| err(format!("cannot write {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| err(format!("cannot rename {} into place: {e}", tmp.display())))
}

/// Wait up to `timeout` for rank 0's id file at `path`, then read it.
pub fn read_id_file(path: &Path, timeout: Duration) -> Result<[u8; ID_BYTES], NcclIdError> {
    let started = Instant::now();
    loop {
        match std::fs::read(path) {
            Ok(bytes) => {
                return bytes.try_into().map_err(|b: Vec<u8>| NcclIdError::File {
                    path: path.to_path_buf(),
                    detail: format!("holds {} bytes; an NCCL id has {ID_BYTES}", b.len()),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if started.elapsed() >= timeout {
                    return Err(NcclIdError::Timeout { path: path.to_path_buf(), waited: timeout });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(NcclIdError::File { path: path.to_path_buf(), detail: e.to_string() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::LocalComm;

    fn id(seed: u8) -> [u8; ID_BYTES] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
    }

    /// Every byte value 0..=255 crosses the f32 broadcast unchanged, to every
    /// rank, for 2 and 3 ranks; `make` runs on rank 0 only.
    #[test]
    fn rank_zeros_id_reaches_every_rank() {
        for world in [2, 3] {
            let ranks = LocalComm::group(world);
            let got: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = ranks
                    .iter()
                    .map(|c| {
                        s.spawn(move || {
                            exchange_id(c, || {
                                assert_eq!(c.rank(), 0, "make runs on rank 0 only");
                                Ok(id(7))
                            })
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
            });
            for (r, g) in got.into_iter().enumerate() {
                assert_eq!(g.expect("exchanged"), id(7), "rank {r} of {world}");
            }
        }
    }

    /// Rank 0 failing to make an id is an error on every rank, not a hang.
    #[test]
    fn a_failure_on_rank_zero_reaches_every_rank() {
        let ranks = LocalComm::group(2);
        let got: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks.iter().map(|c| s.spawn(move || exchange_id(c, || Err("no NCCL".into())))).collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        assert!(matches!(&got[0], Err(NcclIdError::Make(m)) if m == "no NCCL"), "{:?}", got[0]);
        assert!(matches!(&got[1], Err(NcclIdError::Corrupt { rank: 1, index: 0, .. })), "{:?}", got[1]);
    }

    #[test]
    fn a_value_that_is_no_byte_is_refused() {
        let mut wire = [0f32; ID_BYTES];
        wire[5] = 2.5;
        assert!(matches!(decode(1, &wire), Err(NcclIdError::Corrupt { rank: 1, index: 5, .. })));
        wire[5] = 256.0;
        assert!(matches!(decode(1, &wire), Err(NcclIdError::Corrupt { index: 5, .. })));
    }

    #[test]
    fn the_file_round_trips_times_out_and_refuses_a_wrong_length() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nccl.id");
        let t = Duration::from_millis(50);
        assert!(matches!(read_id_file(&path, t), Err(NcclIdError::Timeout { .. })));
        // A reader started before the writer sees the whole id.
        let reader = {
            let path = path.clone();
            std::thread::spawn(move || read_id_file(&path, Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(30));
        write_id_file(&path, &id(3)).expect("written");
        assert_eq!(reader.join().expect("reader").expect("read"), id(3));
        std::fs::write(&path, [1u8; 12]).expect("written");
        let e = read_id_file(&path, t).unwrap_err();
        assert!(e.to_string().contains("holds 12 bytes"), "{e}");
    }
}
