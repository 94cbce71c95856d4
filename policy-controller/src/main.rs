//! `policy-controller`: see [`policy_controller::cli`].
#![forbid(unsafe_code)]

use clap::{CommandFactory, FromArgMatches};
use policy_controller::cli::{Cli, Command, run_sync};

// `version()`: see scripts/version_string.rs.
include!("../../scripts/version_string.rs");

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POLICY_CONTROLLER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // `--version` prints the version with the commit (see scripts/version_string.rs).
    let matches = Cli::command().version(version()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = match cli.command {
        Command::Sync(args) => run_sync(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the whole cause chain on one line.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
