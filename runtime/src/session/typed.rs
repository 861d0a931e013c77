//! The typed shorthands of [`Session`]'s element-generic methods: one line
//! each, forwarding to [`Session::fetch`], [`Session::fetch_into`],
//! [`Session::feed`], [`Session::feed_with`], [`Session::variable`],
//! [`Session::variable_into`] and [`Session::set_variable`] with the element
//! type in the name.
//!
//! They keep the names code written against earlier versions calls
//! (`feed_f32`, `fetch_f32`, `read_variable`, ...) and read well where a
//! literal would leave the generic form's type open
//! (`write_variable("w", &[0.5, 0.5])`). Invariant: no logic here, only the
//! forward; every check and error lives in the generic method.

use super::Session;
use crate::error::RuntimeError;

impl Session {
    /// [`Session::fetch`] of an f32 tensor.
    pub fn fetch_f32(&self, program: &str, name: &str) -> Result<Vec<f32>, RuntimeError> {
        self.fetch::<f32>(program, name)
    }

    /// [`Session::fetch`] of an i32 or bool tensor.
    pub fn fetch_i32(&self, program: &str, name: &str) -> Result<Vec<i32>, RuntimeError> {
        self.fetch::<i32>(program, name)
    }

    /// [`Session::fetch_into`] of an f32 tensor.
    pub fn fetch_f32_into(&self, program: &str, name: &str, out: &mut [f32]) -> Result<(), RuntimeError> {
        self.fetch_into(program, name, out)
    }

    /// [`Session::fetch_into`] of an i32 or bool tensor.
    pub fn fetch_i32_into(&self, program: &str, name: &str, out: &mut [i32]) -> Result<(), RuntimeError> {
        self.fetch_into(program, name, out)
    }

    /// [`Session::feed`] of an f32 placeholder.
    pub fn feed_f32(&mut self, program: &str, feed: &str, data: &[f32]) -> Result<(), RuntimeError> {
        self.feed(program, feed, data)
    }

    /// [`Session::feed`] of an i32 or bool placeholder.
    pub fn feed_i32(&mut self, program: &str, feed: &str, data: &[i32]) -> Result<(), RuntimeError> {
        self.feed(program, feed, data)
    }

    /// [`Session::feed_with`] of an f32 placeholder.
    pub fn feed_with_f32<R>(
        &mut self,
        program: &str,
        feed: &str,
        fill: impl FnOnce(&mut [f32]) -> R,
    ) -> Result<R, RuntimeError> {
        self.feed_with(program, feed, fill)
    }

    /// [`Session::feed_with`] of an i32 or bool placeholder.
    pub fn feed_with_i32<R>(
        &mut self,
        program: &str,
        feed: &str,
        fill: impl FnOnce(&mut [i32]) -> R,
    ) -> Result<R, RuntimeError> {
        self.feed_with(program, feed, fill)
    }

    /// [`Session::variable`] of an f32 variable.
    pub fn read_variable(&self, name: &str) -> Result<Vec<f32>, RuntimeError> {
        self.variable::<f32>(name)
    }

    /// [`Session::variable`] of an i32 or bool variable (e.g. `global_step`).
    pub fn read_variable_i32(&self, name: &str) -> Result<Vec<i32>, RuntimeError> {
        self.variable::<i32>(name)
    }

    /// [`Session::variable_into`] of an f32 variable.
    pub fn read_variable_into(&self, name: &str, out: &mut [f32]) -> Result<(), RuntimeError> {
        self.variable_into(name, out)
    }

    /// [`Session::variable_into`] of an i32 or bool variable.
    pub fn read_variable_i32_into(&self, name: &str, out: &mut [i32]) -> Result<(), RuntimeError> {
        self.variable_into(name, out)
    }

    /// [`Session::set_variable`] of an f32 variable.
    pub fn write_variable(&mut self, name: &str, data: &[f32]) -> Result<(), RuntimeError> {
        self.set_variable(name, data)
    }

    /// [`Session::set_variable`] of an i32 or bool variable.
    pub fn write_variable_i32(&mut self, name: &str, data: &[i32]) -> Result<(), RuntimeError> {
        self.set_variable(name, data)
    }
}
