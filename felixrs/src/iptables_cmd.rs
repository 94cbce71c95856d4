//! `felixrs iptables ...`: operator tools over iptables-save text.

use std::process::ExitCode;

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct IptablesArgs {
    #[command(subcommand)]
    command: IptablesCommand,
}

#[derive(Subcommand)]
enum IptablesCommand {}

pub fn run(args: IptablesArgs) -> ExitCode {
    match args.command {}
}
