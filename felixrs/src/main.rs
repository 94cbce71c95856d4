//! felixrs: the node agent binary and its operator tools.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod iptables_cmd;

#[derive(Parser)]
#[command(
    name = "felixrs",
    version,
    about = "Calico-style iptables network-policy agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tools that work on iptables-save text.
    Iptables(iptables_cmd::IptablesArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Iptables(args) => iptables_cmd::run(args),
    }
}
