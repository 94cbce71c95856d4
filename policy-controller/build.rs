// The version string of `--version`: see scripts/build_version.rs.
include!("../scripts/build_version.rs");
