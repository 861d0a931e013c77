//! What a user looks at during and after a run: [`Watch`] is a
//! [`TrainObserver`] that records the curves ([`History`]) for `--plot` and,
//! with `--logdir`, writes them and the placed graph to a TensorBoard event
//! file as they come; [`Tee`] hands every callback to two observers (the
//! CLI's printer and a `Watch`).
//!
//! Scalar tags: `loss` and `examples_per_sec` every step, `train_accuracy`
//! every step of a model that names one, `test_accuracy`
//! when the run evaluates, `learning_rate` when a schedule reports it.
//! Observer callbacks cannot fail, so the first write error is kept and
//! returned by [`Watch::finish`]; after it nothing more is written.

use std::path::Path;

use towers_graph::Graph;

use crate::logdir::{EventWriter, LogdirError};
use crate::train::TrainObserver;

/// The curves of a run, by step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub loss: Vec<(usize, f32)>,
    pub test_accuracy: Vec<(usize, f64)>,
    pub learning_rate: Vec<(usize, f32)>,
    /// The training accuracy of each logged step (across towers and ranks).
    pub train_accuracy: Vec<(usize, f32)>,
}

/// Records the curves and, with a log dir, writes TensorBoard events.
#[derive(Default)]
pub struct Watch {
    events: Option<EventWriter>,
    history: History,
    error: Option<LogdirError>,
}

impl Watch {
    /// A recorder that writes nothing.
    pub fn new() -> Watch {
        Watch::default()
    }

    /// A recorder writing a new event file in `logdir`.
    pub fn with_logdir(logdir: &Path) -> Result<Watch, LogdirError> {
        Ok(Watch { events: Some(EventWriter::create(logdir)?), ..Watch::default() })
    }

    /// The event file, when there is one.
    pub fn event_file(&self) -> Option<&Path> {
        self.events.as_ref().map(|w| w.path())
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    /// The curves, or the first error writing events.
    pub fn finish(self) -> Result<History, LogdirError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.history),
        }
    }

    fn write(&mut self, f: impl FnOnce(&mut EventWriter) -> Result<(), LogdirError>) {
        if self.error.is_some() {
            return;
        }
        if let Some(w) = &mut self.events {
            if let Err(e) = f(w) {
                self.error = Some(e);
            }
        }
    }
}

impl TrainObserver for Watch {
    fn compiled(&mut self, graph: &Graph) {
        self.write(|w| w.graph(graph));
    }

    fn step(&mut self, step: usize, loss: f32, examples_per_sec: f64) {
        self.history.loss.push((step, loss));
        self.write(|w| w.scalars(step as i64, &[("loss", loss), ("examples_per_sec", examples_per_sec as f32)]));
    }

    fn train_accuracy(&mut self, step: usize, accuracy: f32) {
        self.history.train_accuracy.push((step, accuracy));
        self.write(|w| w.scalars(step as i64, &[("train_accuracy", accuracy)]));
    }

    fn eval(&mut self, step: usize, accuracy: f64) {
        self.history.test_accuracy.push((step, accuracy));
        self.write(|w| w.scalars(step as i64, &[("test_accuracy", accuracy as f32)]));
    }

    fn learning_rate(&mut self, step: usize, lr: f32) {
        self.history.learning_rate.push((step, lr));
        self.write(|w| w.scalars(step as i64, &[("learning_rate", lr)]));
    }
}

/// Hands every callback to both observers, `0` first.
pub struct Tee<'a>(pub &'a mut dyn TrainObserver, pub &'a mut dyn TrainObserver);

impl TrainObserver for Tee<'_> {
    fn start(&mut self, total_steps: usize, backend_note: &str) {
        self.0.start(total_steps, backend_note);
        self.1.start(total_steps, backend_note);
    }
    fn step(&mut self, step: usize, loss: f32, examples_per_sec: f64) {
        self.0.step(step, loss, examples_per_sec);
        self.1.step(step, loss, examples_per_sec);
    }
    fn train_accuracy(&mut self, step: usize, accuracy: f32) {
        self.0.train_accuracy(step, accuracy);
        self.1.train_accuracy(step, accuracy);
    }
    fn compiled(&mut self, graph: &Graph) {
        self.0.compiled(graph);
        self.1.compiled(graph);
    }
    fn eval(&mut self, step: usize, accuracy: f64) {
        self.0.eval(step, accuracy);
        self.1.eval(step, accuracy);
    }
    fn learning_rate(&mut self, step: usize, lr: f32) {
        self.0.learning_rate(step, lr);
        self.1.learning_rate(step, lr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{train, TrainConfig};

    #[test]
    fn records_every_step_and_the_final_accuracy_and_writes_events() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut w = Watch::with_logdir(dir.path()).expect("logdir");
        let cfg = TrainConfig { steps: Some(5), ..TrainConfig::default() };
        let r = train(&cfg, &mut w).expect("train");
        let file = w.event_file().expect("an event file").to_path_buf();
        let h = w.finish().expect("no write error");
        assert_eq!(h.loss.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        assert_eq!(h.test_accuracy, [(5, r.test_accuracy)]);
        // The schedule's rate of every step (constant: --lr's default 0.05).
        assert_eq!(h.learning_rate, (1..=5).map(|s| (s, 0.05)).collect::<Vec<_>>());
        // version + graph + 5 steps + accuracy + learning rate, each a record of > 16 bytes
        let bytes = std::fs::read(&file).expect("read");
        assert!(bytes.len() > 9 * 16);
    }
}
