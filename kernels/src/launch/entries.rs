//! CUDA entry points. Each family names the entry points its `.cu`
//! defines once, in its `desc.rs` (with [`entries!`]), and lists them in
//! its descriptor; [`all`] is derived from the families. The compile tests
//! check each one exists in its family's source.

use crate::Family;

/// An `extern "C" __global__` entry point of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// The family (folder under `kernels/src`) whose `.cu` defines it.
    pub family: &'static str,
    /// The entry point's name.
    pub name: &'static str,
}

/// `entries! { "family"; CONST = "towers_name_f32"; ... }`: one public
/// constant per entry point of the family's `.cu`, and `ENTRIES`, all of
/// them in order (the descriptor's [`crate::family::Desc::entries`]).
macro_rules! entries {
    ($family:literal; $($c:ident = $name:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "` of `", $family, "`.")]
            pub const $c: $crate::launch::Entry = $crate::launch::Entry { family: $family, name: $name };
        )*
        /// Every entry point of this family's `.cu`, in order.
        pub const ENTRIES: &[$crate::launch::Entry] = &[$($c),*];
    };
}
pub(crate) use entries;

/// Every entry point of every family, in family order.
pub fn all() -> impl Iterator<Item = Entry> {
    Family::ALL.iter().flat_map(|f| f.desc().entries.iter().copied())
}
