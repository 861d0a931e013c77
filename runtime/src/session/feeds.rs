//! Feeds of a [`Session`]'s programs: copied in ([`Session::feed`]) or
//! written in place ([`Session::feed_with`]), with the same
//! checks and errors (see the session's module docs). Every write marks
//! the feed fed; `Session::run` refuses a program with a feed never fed
//! since it was loaded ([`RuntimeError::Unfed`]). Sizes are checked against
//! the placeholder's shape and said in shapes and rows
//! ([`RuntimeError::FeedLength`]). A feed of a placeholder of the graph
//! that the program does not read (pruned: nothing it computes depends on
//! it) is checked against the placeholder's type and ignored, as TF1's
//! `feed_dict` takes any placeholder of the graph.

use towers_codegen::{BufRef, Plan, UnreadFeed};
use towers_vocab::DType;

use super::{compatible, list, lookup, Element, Program, Session};
use crate::backend::{HostSlice, HostSliceMut};
use crate::error::RuntimeError;
use crate::variables::HostVec;

impl Session {
    /// The shape of what `r` names in `plan` (empty when unknown).
    pub(super) fn shape_of(plan: &Plan, r: &BufRef) -> Vec<usize> {
        plan.type_of(r).map(|(_, s)| s.to_vec()).unwrap_or_default()
    }

    /// The one body of every copied feed.
    fn feed_host(&mut self, program: &str, feed: &str, data: HostSlice<'_>, dtype: DType) -> Result<(), RuntimeError> {
        // Borrow the field only: the backend is written below.
        let p = lookup(&self.programs, program)?;
        if let Some(u) = p.plan.unread_feeds.iter().find(|u| u.name == feed) {
            return unread_feed(program, u, dtype, Some(data.len()));
        }
        let index = p.plan.feeds.iter().position(|(n, _)| n == feed).ok_or_else(|| RuntimeError::UnknownFeed {
            program: program.into(),
            feed: feed.into(),
            feeds: list(p.plan.feeds.iter().map(|(n, _)| n.as_str())),
        })?;
        let r = &p.plan.feeds[index].1;
        let (len, actual) = Session::extent(&p.plan, r);
        if !compatible(actual, dtype) {
            return Err(RuntimeError::WrongDtype {
                program: program.into(),
                name: feed.into(),
                actual: actual.to_string(),
                requested: dtype.to_string(),
            });
        }
        if len != data.len() {
            return Err(RuntimeError::FeedLength {
                program: program.into(),
                feed: feed.into(),
                shape: Session::shape_of(&p.plan, r),
                expected: len,
                got: data.len(),
            });
        }
        self.backend.write_buffer(p.id, r, data).map_err(|e| RuntimeError::from_backend(program, e))?;
        if let Some(p) = self.programs.get_mut(program) {
            p.fed[index] = true;
        }
        Ok(())
    }

    /// Write the feed `feed` of `program` in place: `fill` gets the memory
    /// the next run reads (see [`Session::feed_with`]); `take` unwraps
    /// the lent slice of the requested type (`None`: the backend lent
    /// another type, an error). The one body of every in-place feed.
    fn feed_with_host<R>(
        &mut self,
        program: &str,
        feed: &str,
        dtype: DType,
        take: impl FnOnce(HostSliceMut<'_>) -> Option<R>,
    ) -> Result<R, RuntimeError> {
        // Borrow the fields apart: the backend lends while the plan is read.
        let Session { programs, backend, .. } = self;
        let Program { id, plan, scratch, fed, .. } = match programs.get_mut(program) {
            Some(p) => p,
            None => {
                let loaded = list(programs.keys().map(|s| s.as_str()));
                return Err(RuntimeError::UnknownProgram { program: program.into(), loaded });
            }
        };
        if let Some(u) = plan.unread_feeds.iter().find(|u| u.name == feed) {
            unread_feed(program, u, dtype, None)?;
            return Err(RuntimeError::UnreadFeed {
                program: program.into(),
                feed: feed.into(),
                detail: "it has no memory to lend to feed_with; feed it with Session::feed (checked and ignored, as TF1's feed_dict), or do not feed it to this program".into(),
            });
        }
        let Some(index) = plan.feeds.iter().position(|(n, _)| n == feed) else {
            return Err(RuntimeError::UnknownFeed {
                program: program.into(),
                feed: feed.into(),
                feeds: list(plan.feeds.iter().map(|(n, _)| n.as_str())),
            });
        };
        let r = &plan.feeds[index].1;
        let (len, actual) = Session::extent(plan, r);
        if !compatible(actual, dtype) {
            return Err(RuntimeError::WrongDtype {
                program: program.into(),
                name: feed.into(),
                actual: actual.to_string(),
                requested: dtype.to_string(),
            });
        }
        // The closure is called at most once, by the backend or below; a
        // lent slice of another length or type is refused before the
        // caller sees it.
        let mut take = Some(take);
        let mut got: Option<Result<R, usize>> = None;
        let mut lend = |s: HostSliceMut<'_>| {
            if let Some(f) = take.take() {
                let n = s.len();
                got = Some(if n == len { f(s).ok_or(n) } else { Err(n) });
            }
        };
        let lent = backend.with_feed_buffer(*id, r, &mut lend).map_err(|e| RuntimeError::from_backend(program, e))?;
        if !lent {
            let s = scratch[index].get_or_insert_with(|| HostVec::zeros(actual, len));
            lend(s.as_mut_slice());
            backend.write_buffer(*id, r, s.as_slice()).map_err(|e| RuntimeError::from_backend(program, e))?;
        }
        match got {
            Some(Ok(r)) => {
                fed[index] = true;
                Ok(r)
            }
            Some(Err(n)) => Err(RuntimeError::Backend {
                program: program.into(),
                detail: format!(
                    "the {} backend lent {n} elements, or another type, for feed '{feed}' ({actual}, {len} elements)",
                    backend.name()
                ),
            }),
            None => Err(RuntimeError::Backend {
                program: program.into(),
                detail: format!("the {} backend lent no memory for feed '{feed}'", backend.name()),
            }),
        }
    }

    /// Write the placeholder `feed` of `program` in place, without a copy
    /// from a vector of the caller's: `fill` gets the memory the next
    /// [`Session::run`] reads (on the CPU backend the arena itself, on the
    /// CUDA backend pinned host memory that is copied to the GPU when `fill`
    /// returns), of the feed's length, and its return value is returned.
    /// `&mut [f32]` for an f32 placeholder, `&mut [i32]` for an i32 or bool
    /// (0/1) one; name the type where the closure does not
    /// (`feed_with::<f32, _>`, or `|x: &mut [f32]| ..`). Checks and errors as
    /// [`Session::feed`]: an unknown program or feed, or a feed of another
    /// dtype, is an error and `fill` is not called. Allocates nothing on the
    /// CPU and CUDA backends (on another backend, once per feed: a scratch
    /// vector then handed to its `write_buffer`).
    ///
    /// **`fill` must write every element.** The slice is initialized memory
    /// (never undefined behaviour to read) but its values are unspecified:
    /// the feed's last value on the CPU backend, the last value lent for
    /// this feed on the CUDA backend, zeros at first. Whatever `fill` leaves
    /// there is fed, even when it returns an error value of its own.
    ///
    /// ```
    /// # use towers_runtime::Session;
    /// # fn f(s: &mut Session, batch: &[f32]) -> Result<(), towers_runtime::RuntimeError> {
    /// // Gather a batch straight into the feed: no intermediate vector.
    /// s.feed_with("train", "images", |x| x.copy_from_slice(batch))?;
    /// s.run("train")?;
    /// # Ok(()) }
    /// ```
    pub fn feed_with<T: Element, R>(
        &mut self,
        program: &str,
        feed: &str,
        fill: impl FnOnce(&mut [T]) -> R,
    ) -> Result<R, RuntimeError> {
        self.feed_with_host(program, feed, T::DTYPE, |s| T::of_host_mut(s).map(fill))
    }

    /// Copy `data` into the placeholder `feed` of `program`: f32 data for an
    /// f32 placeholder, i32 for an i32 or bool (0/1) one (the element type
    /// comes from `data`); another type is [`RuntimeError::WrongDtype`], a
    /// length other than the placeholder's is [`RuntimeError::FeedLength`].
    pub fn feed<T: Element>(&mut self, program: &str, feed: &str, data: &[T]) -> Result<(), RuntimeError> {
        self.feed_host(program, feed, T::host(data), T::DTYPE)
    }
}

/// A feed of a placeholder the program does not read: checked against the
/// placeholder's dtype and, with `len`, its shape (a multiple of the known
/// dimensions' product where a dimension is unknown), then ignored.
fn unread_feed(program: &str, u: &UnreadFeed, dtype: DType, len: Option<usize>) -> Result<(), RuntimeError> {
    let bad = |detail: String| RuntimeError::UnreadFeed { program: program.into(), feed: u.name.clone(), detail };
    if !compatible(u.dtype, dtype) {
        return Err(bad(format!("it is {}, not {dtype}", u.dtype)));
    }
    let Some(len) = len else { return Ok(()) };
    let known: usize = u.shape.iter().flatten().product();
    let exact = u.shape.iter().all(Option::is_some);
    let shape: Vec<String> = u.shape.iter().map(|d| d.map_or("?".to_string(), |d| d.to_string())).collect();
    let fits = if exact { len == known } else { known == 0 || len % known == 0 };
    if !fits {
        return Err(bad(format!("{len} elements do not fill its shape [{}]", shape.join(","))));
    }
    Ok(())
}
