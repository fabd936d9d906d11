//! The C ABI (filled in below).
