//! Tests of the operand table and its generic check.
