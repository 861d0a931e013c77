//! TensorBoard event files: `--logdir DIR`.
//!
//! [`EventWriter`] creates `DIR/events.out.tfevents.<unix seconds>.<host>.<pid>.<n>`
//! (TensorFlow 2's naming, so `tensorboard --logdir DIR` finds it; `n` counts
//! the writers this process made in that second) and appends
//! TFRecord-framed `tensorflow.Event` protos: first the file version
//! `brain.Event:2`, then scalars ([`EventWriter::scalar`]) and the placed
//! graph ([`EventWriter::graph`], built by [`graph_def`]) whose nodes carry
//! their TF device strings, so TensorBoard's graph view colours placement by
//! device as it did for TF1 towers.
//!
//! Invariant: every record is flushed when written, so a reader (TensorBoard
//! while training runs, or a crash) sees whole records only up to the last
//! write; the library never prints.

mod graphdef;
pub mod proto;
mod record;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use thiserror::Error;
use towers_graph::Graph;

pub use graphdef::{graph_def, tf_device};
pub use record::{masked_crc32c, write_record};

use proto::{Event, Summary, SummaryValue, What};

/// An I/O error of the event writer, naming the file.
#[derive(Debug, Error)]
#[error("--logdir: cannot write {path}: {source}")]
pub struct LogdirError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The counter of the event files this process creates (their names' last part).
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Appends events to one event file.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` (and its parents) and a new event file in it.
    pub fn create(dir: &Path) -> Result<EventWriter, LogdirError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LogdirError { path, source }
        };
        std::fs::create_dir_all(dir).map_err(err(dir))?;
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let (host, pid) = (hostname(), std::process::id());
        // Never an existing file: two runs (or two writers of one process)
        // in the same second used to truncate each other's events. The name
        // holds the process id and a counter; `create_new` refuses a file
        // that exists (another writer's), and the next counter is tried.
        let mut n = NEXT.fetch_add(1, Ordering::Relaxed);
        let (path, file) = loop {
            let path = dir.join(format!("events.out.tfevents.{secs}.{host}.{pid}.{n}"));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < u64::MAX => {
                    n = NEXT.fetch_add(1, Ordering::Relaxed).max(n + 1)
                }
                Err(e) => return Err(err(&path)(e)),
            }
        };
        let mut w = EventWriter { path, out: BufWriter::new(file) };
        w.write(0, What::FileVersion("brain.Event:2".into()))?;
        Ok(w)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One scalar (`simple_value`) under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f32) -> Result<(), LogdirError> {
        self.scalars(step, &[(tag, value)])
    }

    /// Several scalars at `step`, in one event.
    pub fn scalars(&mut self, step: i64, values: &[(&str, f32)]) -> Result<(), LogdirError> {
        let value = values.iter().map(|&(tag, v)| SummaryValue { tag: tag.into(), simple_value: Some(v) }).collect();
        self.write(step, What::Summary(Summary { value }))
    }

    /// The graph, as a `GraphDef` event (see [`graph_def`]).
    pub fn graph(&mut self, g: &Graph) -> Result<(), LogdirError> {
        self.write(0, What::GraphDef(graph_def(g).encode_to_vec()))
    }

    fn write(&mut self, step: i64, what: What) -> Result<(), LogdirError> {
        let wall_time = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let event = Event { wall_time, step, what: Some(what) };
        let path = &self.path;
        let err = |source| LogdirError { path: path.clone(), source };
        write_record(&mut self.out, &event.encode_to_vec()).map_err(err)?;
        self.out.flush().map_err(err)
    }
}

/// The host name for the file name (`localhost` when unknown), with path
/// separators removed.
fn hostname() -> String {
    let raw = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    let h: String = raw.trim().chars().filter(|c| !matches!(c, '/' | '\\') && !c.is_control()).collect();
    if h.is_empty() {
        "localhost".into()
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back the records of an event file (checking both CRCs).
    fn records(bytes: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
            assert_eq!(&bytes[at + 8..at + 12], &masked_crc32c(len_bytes).to_le_bytes());
            let data = &bytes[at + 12..at + 12 + len];
            assert_eq!(&bytes[at + 12 + len..at + 16 + len], &masked_crc32c(data).to_le_bytes());
            out.push(Event::decode(data).expect("an Event"));
            at += 16 + len;
        }
        out
    }

    #[test]
    fn writes_version_scalars_and_graph() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sub = dir.path().join("run1");
        let mut w = EventWriter::create(&sub).expect("create");
        w.scalar("loss", 3, 0.5).expect("scalar");
        let mut b = towers_graph::GraphBuilder::with_seed(1);
        let x = b.placeholder("x", towers_graph::DType::F32, towers_graph::Shape::known(&[2])).expect("x");
        b.identity(x, "y").expect("y");
        w.graph(&b.finish()).expect("graph");
        let path = w.path().to_path_buf();
        drop(w);
        let name = path.file_name().expect("name").to_string_lossy().to_string();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        let ev = records(&std::fs::read(&path).expect("read"));
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].what, Some(What::FileVersion("brain.Event:2".into())));
        match &ev[1].what {
            Some(What::Summary(s)) => {
                assert_eq!(ev[1].step, 3);
                assert_eq!(s.value[0].tag, "loss");
                assert_eq!(s.value[0].simple_value, Some(0.5));
            }
            other => panic!("{other:?}"),
        }
        match &ev[2].what {
            Some(What::GraphDef(bytes)) => {
                let g = proto::GraphDef::decode(bytes.as_slice()).expect("GraphDef");
                let names: Vec<&str> = g.node.iter().map(|n| n.name.as_str()).collect();
                assert_eq!(names, ["x", "y"]);
                assert_eq!(g.node[1].input, ["x"]);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Two writers into one folder at once (two runs in the same second)
    /// make two files, each whole: neither truncates the other's events;
    /// a file already there (another process's) is never opened.
    #[test]
    fn two_writers_in_one_folder_keep_both_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut a = EventWriter::create(dir.path()).expect("first");
        a.scalar("loss", 1, 1.0).expect("scalar");
        let mut b = EventWriter::create(dir.path()).expect("second");
        b.scalar("loss", 2, 2.0).expect("scalar");
        a.scalar("loss", 3, 3.0).expect("scalar");
        assert_ne!(a.path(), b.path());
        let name = b.path().file_name().expect("name").to_string_lossy().to_string();
        assert!(name.contains(&format!(".{}.", std::process::id())), "the pid is in {name}");
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop((a, b));
        let steps = |p: &Path| records(&std::fs::read(p).expect("read")).iter().map(|e| e.step).collect::<Vec<_>>();
        assert_eq!(steps(&pa), [0, 1, 3]);
        assert_eq!(steps(&pb), [0, 2]);
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 2);
        // Another process's file under the name this one would take next
        // is skipped, not truncated.
        let secs = SystemTime::now().duration_since(UNIX_EPOCH).expect("time").as_secs();
        let next = NEXT.load(Ordering::Relaxed);
        let mut taken = Vec::new();
        for s in [secs, secs + 1] {
            for n in next..next + 4 {
                let p = dir.path().join(format!("events.out.tfevents.{s}.{}.{}.{n}", hostname(), std::process::id()));
                std::fs::write(&p, b"other").expect("write");
                taken.push(p);
            }
        }
        let c = EventWriter::create(dir.path()).expect("third");
        assert!(!taken.iter().any(|p| p == c.path()), "{}", c.path().display());
        for p in &taken {
            assert_eq!(std::fs::read(p).expect("read"), b"other");
        }
    }

    #[test]
    fn unwritable_dir_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").expect("write");
        let e = EventWriter::create(&file.join("sub")).err().expect("not a directory");
        assert!(e.to_string().contains("a-file"), "{e}");
    }
}
