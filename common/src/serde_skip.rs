//! The one predicate of `#[serde(skip_serializing_if = "is_default")]`: a
//! field that holds its type's default (`0`, an empty selector, the default
//! profile) is left out of the document, and its `#[serde(default)]` reads
//! it back. Optional fields need none: their struct is marked
//! `#[skip_serializing_none]` (serde_with), which leaves out every `None`,
//! and serde reads a missing `Option` as `None`.
//!
//! Invariant: a document serialised and read back is the same value, and a
//! field at its default never appears in it.

/// Whether `v` is its type's default.
pub(crate) fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
