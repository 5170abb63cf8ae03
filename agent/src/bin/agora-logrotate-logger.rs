//! `agora-logrotate-logger`: appends its standard input to a file,
//! rotating it by size (Mesos's `mesos-logrotate-logger`; see
//! `agora_agent::logrotate`). The agent starts one per stream of each
//! executor with `--container-logger logrotate`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Appends standard input to a file, rotating it by size.
#[derive(Parser)]
#[command(name = "agora-logrotate-logger", version)]
struct Flags {
    /// The file written (`SANDBOX/stdout`); rotated ones are FILE.1, FILE.2, ...
    #[arg(long)]
    log_filename: PathBuf,
    /// Size at which the file is rotated (bytes, or with KB, MB, GB).
    #[arg(long, value_parser = agora_agent::disk::parse_bytes)]
    max_size: u64,
    /// Rotated files kept.
    #[arg(long, default_value_t = agora_agent::logrotate::DEFAULT_MAX_FILES)]
    max_files: usize,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let mut stdin = std::io::stdin().lock();
    match agora_agent::logrotate::copy_rotating(
        &mut stdin,
        &flags.log_filename,
        flags.max_size,
        flags.max_files,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "agora-logrotate-logger: {}: {e}",
                flags.log_filename.display()
            );
            ExitCode::FAILURE
        }
    }
}
