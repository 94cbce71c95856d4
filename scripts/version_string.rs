// The version string of `--version`, included by both binaries' `main.rs`:
// `<package version>[+<FELIXRS_VERSION_EXTRA>] (<commit>)`, the commit from the build script
// (scripts/build_version.rs). The suffix is read here with `option_env!` rather than by the build
// script, so that a build with another suffix (the upgrade test's `-next` image) recompiles only
// the binary, not the package's library.

/// `--version`'s string, e.g. `0.1.0+next (commit 0123456789ab)`.
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let extra = option_env!("FELIXRS_VERSION_EXTRA")
            .filter(|e| !e.is_empty())
            .map(|e| format!("+{e}"))
            .unwrap_or_default();
        format!(
            "{}{extra} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("FELIXRS_BUILD_COMMIT")
        )
    })
}
