//! cargo-fuzz entry for the `iptables_save` target; the properties live in `fuzz/targets/iptables_save.rs`.
#![no_main]

#[path = "../targets/iptables_save.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::run(data));
