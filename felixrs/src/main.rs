//! felixrs: the node agent binary and its operator tools.
#![forbid(unsafe_code)]

use clap::{CommandFactory, FromArgMatches, Subcommand};
use felixrs::cmd::shared::{Answer, finish};

#[derive(clap::Parser)]
#[command(
    name = "felixrs",
    version = version(),
    about = "Calico-style iptables network-policy agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tools that work on iptables-save text.
    Iptables(felixrs::cmd::iptables::IptablesArgs),
    /// Run the node agent: keep this node's kernel equal to what etcd says for it.
    Agent(felixrs::agent::Args),
    /// Print what the agent would program for a node, from manifest files or its snapshot (no etcd,
    /// no root).
    Render(felixrs::cmd::render::Args),
    /// Show which of a node's rules decide a packet between two pods, from manifest files or the
    /// agent's snapshot (optionally checked against the kernel).
    Trace(felixrs::cmd::trace::Args),
    /// Remove every `cali-` chain, hook rule and IP set of ours from this node's kernel (both
    /// iptables backends, both families) and nothing else. Root; stop the agent first.
    Cleanup(felixrs::cmd::cleanup::Args),
    /// Show which policies allow and drop traffic on this node, from the kernel's rule counters
    /// (root, in the node's network namespace).
    Stats(felixrs::cmd::stats::Args),
    /// Print the packets our NFLOG rules log (denied with --log-denied, the Log action with
    /// --log-action nflog), with the deciding policy and the pods (root, on the node).
    Flows(felixrs::cmd::flows::Args),
    /// Show what proposed policies would change on a node before applying them: recorded flows
    /// replayed (--flows, or the agent's flow log), else the reachability matrix of its pods,
    /// before and after. Exit status 0: no change, 1: changes, 2: error.
    Preview(felixrs::cmd::preview::Args),
}

// `version()`: see scripts/version_string.rs.
include!("../../scripts/version_string.rs");

fn main() -> std::process::ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Iptables(args) => felixrs::cmd::iptables::run(args),
        Command::Agent(args) => {
            // Which flags were given (they override FelixConfiguration; defaults do not).
            let explicit = matches
                .subcommand_matches("agent")
                .map(felixrs::agent::explicit_flags)
                .unwrap_or_default();
            finish("agent", args.run(explicit).map(|()| Answer::default()))
        }
        Command::Render(args) => args.run(),
        Command::Trace(args) => args.run(),
        Command::Cleanup(args) => args.run(),
        Command::Stats(args) => args.run(),
        Command::Flows(args) => args.run(),
        Command::Preview(args) => args.run(),
    }
}
