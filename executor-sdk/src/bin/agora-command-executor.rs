//! `agora-command-executor`: the built-in executor an agent starts for
//! tasks that carry a command. Everything lives in
//! [`agora_executor::command`].

fn main() -> std::process::ExitCode {
    agora_executor::command::run()
}
