//! The kvol command line.
fn main() {}
