//! The cargo-fuzz targets (`fuzz/targets/`) on stable, for a bounded time each: every seed and
//! dictionary token, then random mutations (see `felixrs_e2e::fuzz`). Any panic fails the test
//! with the target, the RNG seed to reproduce it (`FELIXRS_FUZZ_SEED`) and the input, which is
//! also saved under `target/fuzz-stable/`.
//!
//! `FELIXRS_FUZZ_SECS` sets the time per target (default 3 s, so a plain `cargo test` stays quick;
//! `scripts/fuzz-stable.sh` gives CI a longer run).

use std::time::Duration;

use felixrs_e2e::fuzz::{Target, load_dict, load_seeds, run, save_crash};

#[path = "../../fuzz/targets/dns_response.rs"]
mod dns_response;
#[path = "../../fuzz/targets/iptables_save.rs"]
mod iptables_save;
#[path = "../../fuzz/targets/manifest.rs"]
mod manifest;
#[path = "../../fuzz/targets/resource.rs"]
mod resource;
#[path = "../../fuzz/targets/selector.rs"]
mod selector;

fn budget() -> Duration {
    let secs: f64 = std::env::var("FELIXRS_FUZZ_SECS")
        .ok()
        .map(|s| {
            s.parse()
                .expect("FELIXRS_FUZZ_SECS must be a number of seconds")
        })
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

fn seed() -> u64 {
    match std::env::var("FELIXRS_FUZZ_SEED") {
        Ok(s) => u64::from_str_radix(s.trim_start_matches("0x"), 16)
            .expect("FELIXRS_FUZZ_SEED must be hex"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

fn fuzz(name: &'static str, f: fn(&[u8]), dict: &str) {
    let target = Target {
        name,
        run: f,
        seeds: load_seeds(name),
        dict: load_dict(dict),
    };
    let seed = seed();
    let out = run(&target, budget(), seed);
    println!(
        "fuzz {name}: seed {seed:016x}, {} executions, corpus {}",
        out.executions, out.corpus
    );
    if let Some((input, msg)) = out.crash {
        let path = save_crash(name, seed, &input);
        panic!(
            "fuzz target {name} panicked (FELIXRS_FUZZ_SEED={seed:016x}, input saved to {}): {msg}\ninput: {:?}",
            path.display(),
            String::from_utf8_lossy(&input)
        );
    }
    assert!(
        out.executions > target.seeds.len() as u64,
        "no mutation ran"
    );
}

#[test]
fn selector_parser() {
    fuzz("selector", selector::run, "selector.dict");
}

#[test]
fn iptables_save_parser() {
    fuzz("iptables_save", iptables_save::run, "iptables_save.dict");
}

#[test]
fn etcd_resource_decoding() {
    fuzz("resource", resource::run, "resource.dict");
}

#[test]
fn manifest_conversion() {
    fuzz("manifest", manifest::run, "manifest.dict");
}

#[test]
fn dns_learner_path() {
    fuzz("dns_response", dns_response::run, "dns_response.dict");
}
