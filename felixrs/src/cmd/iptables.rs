//! `felixrs iptables ...`: operator tools over iptables-save text.
//!
//! * `roundtrip [FILE]`: parse iptables-save / ip6tables-save text (stdin without FILE) and print it
//!   re-rendered from the typed model. Kernel output comes back byte for byte; program-written
//!   restore input comes back in the kernel's normal form. On a syntax error: `LINE:COL: message`
//!   on stderr and exit status 1. With `--lenient` a rule line it cannot type is kept verbatim
//!   (`warning: LINE:COL: …` on stderr), as the agent reads the kernel.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct IptablesArgs {
    #[command(subcommand)]
    command: IptablesCommand,
}

#[derive(Subcommand)]
enum IptablesCommand {
    /// Parse iptables-save output and print it re-rendered (exact for kernel output).
    Roundtrip {
        /// File with iptables-save text; stdin when absent.
        file: Option<PathBuf>,
        /// Kernel output: keep a rule line the parser cannot type verbatim (warning on stderr)
        /// instead of failing.
        #[arg(long)]
        lenient: bool,
    },
}

pub fn run(args: IptablesArgs) -> ExitCode {
    match args.command {
        IptablesCommand::Roundtrip { file, lenient } => roundtrip(file, lenient),
    }
}

fn read_input(file: Option<&PathBuf>) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    match file {
        Some(path) => {
            bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut bytes)
                .context("reading stdin")?;
        }
    }
    let what = file.map_or_else(|| "stdin".to_string(), |p| p.display().to_string());
    String::from_utf8(bytes).with_context(|| format!("{what} is not UTF-8 text"))
}

fn roundtrip(file: Option<PathBuf>, lenient: bool) -> ExitCode {
    let text = match read_input(file.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("felixrs iptables roundtrip: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // Each line is rendered as soon as it is parsed (the model of a 90k-rule dump is never held
    // whole); a large dump is parsed in chunks on several threads, each into its own buffer, and
    // the buffers are written in order (no copy into one). The text is written only once all of it
    // parsed, so an error prints no partial output.
    let parsed = if lenient {
        // Kernel output comes back as it was: its length is the capacity the text needs.
        let mut rendered = String::with_capacity(text.len() + text.len() / 8 + 64);
        iptables::parse::roundtrip_save_lenient(&text, &mut rendered).map(|warnings| {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            vec![rendered]
        })
    } else {
        let threads = iptables::parse::roundtrip_threads(text.len());
        iptables::parse::roundtrip_save_parts(&text, threads)
    };
    match parsed {
        Ok(parts) => {
            let mut out = std::io::stdout().lock();
            if let Err(e) = parts
                .iter()
                .try_for_each(|p| out.write_all(p.as_bytes()))
                .and_then(|()| out.flush())
            {
                eprintln!("felixrs iptables roundtrip: writing stdout: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
