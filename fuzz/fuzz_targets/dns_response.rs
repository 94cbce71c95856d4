//! cargo-fuzz entry for the `dns_response` target; the properties live in
//! `fuzz/targets/dns_response.rs`.
#![no_main]

#[path = "../targets/dns_response.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
