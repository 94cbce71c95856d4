//! cargo-fuzz entry for the `manifest` target; the properties live in `fuzz/targets/manifest.rs`.
#![no_main]

#[path = "../targets/manifest.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
