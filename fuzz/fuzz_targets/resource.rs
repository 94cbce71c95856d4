//! cargo-fuzz entry for the `resource` target; the properties live in `fuzz/targets/resource.rs`.
#![no_main]

#[path = "../targets/resource.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
