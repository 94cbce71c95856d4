//! cargo-fuzz entry for the `selector` target; the properties live in `fuzz/targets/selector.rs`.
#![no_main]

#[path = "../targets/selector.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
