//! What a container runs: the task's `CommandInfo` applied over the
//! image's runtime config (`Entrypoint`, `Cmd`, `Env`, `WorkingDir`), by
//! Mesos's rules.
//!
//! The rules are those of Mesos's `docker/runtime` isolator
//! (`src/slave/containerizer/mesos/isolators/docker/runtime.cpp`,
//! `getLaunchCommand`, and the table in `docs/isolators/docker-runtime.md`),
//! and, for the environment and working directory, of the Mesos
//! containerizer's launch (`containerizer.cpp`, `launch.cpp`):
//!
//! | `CommandInfo`               | no Entrypoint, no Cmd | Cmd only         | Entrypoint only       | Entrypoint and Cmd         |
//! |-----------------------------|-----------------------|------------------|-----------------------|----------------------------|
//! | shell=0 value=0 arguments=0 | error                 | `Cmd[0] Cmd[1..]`| `Ep[0] Ep[1..]`       | `Ep[0] Ep[1..] Cmd..`      |
//! | shell=0 value=0 arguments=1 | error                 | `Cmd[0] args`    | `Ep[0] Ep[1..] args`  | `Ep[0] Ep[1..] args`       |
//! | shell=0 value=1             | `value` with `arguments` as argv, whatever the image says                                   ||||
//! | shell=1 value=0             | error                                                                                        ||||
//! | shell=1 value=1             | `/bin/sh -c value`, whatever the image says (arguments are not used)                         ||||
//!
//! So the task's `arguments`, when it gives no `value`, take the place of
//! the image's `Cmd` (not of its `Entrypoint`), as Docker's
//! `docker run IMAGE ARGS...` does.
//!
//! With `shell=false` and a `value`, `arguments` is the whole argv
//! (`arguments[0]` is argv\[0\]), as in Mesos. An OCI runtime executes
//! `args[0]` itself (looked up in the container's `PATH`), so argv\[0\]
//! cannot differ from the program: the program is `value` and the rest
//! is `arguments[1..]`; when `arguments[0]` names another program than
//! `value` (their last path components differ, as with
//! `value=/bin/busybox, arguments=[sh, -c, ...]`, where a multi-call
//! binary would run a different program), the launch is refused with a
//! message naming both rather than run something else. No arguments at
//! all runs `value` alone.
//!
//! Environment, lowest first (a later one overrides an earlier one of the
//! same name): the image's `Env`; the task's environment (what the agent
//! passes, `CommandInfo.environment` included); then `MESOS_SANDBOX`, set
//! to the sandbox as the container sees it. Mesos lets the task's own
//! variables override `MESOS_SANDBOX`; here it is always the container's
//! path, because the agent's host-side `MESOS_SANDBOX` would be wrong
//! inside an image. `PATH` is the host's default
//! (`/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`) when
//! neither the image nor the task sets one (Mesos's `launch.cpp`). An
//! image `Env` entry without `=` is skipped with a warning, as Mesos does
//! (it is the image's content, not the client's input).
//!
//! Working directory: the image's `WorkingDir` when it is set and not
//! empty (created in the root file system when the image lacks it, as
//! Mesos's launcher does), otherwise the sandbox (`/mnt/mesos/sandbox`
//! for a container with an image, the host sandbox without one), as
//! Mesos's containerizer does for non-debug containers.

use std::path::Path;

/// The default `PATH` when neither the image nor the task sets one (Mesos's
/// `os::host_default_path()`).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The runtime part of an image's config (what the provisioner reads from
/// the image: Docker's `config` / OCI's `config` object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `Entrypoint` (empty: none).
    pub entrypoint: Vec<String>,
    /// `Cmd` (empty: none).
    pub cmd: Vec<String>,
    /// `Env`, as `NAME=value` strings.
    pub env: Vec<String>,
    /// `WorkingDir` (`None` or empty: none).
    pub working_dir: Option<String>,
    /// `User`: `name`, `uid`, `name:group`, `uid:gid`, ... (`None` or
    /// empty: root).
    pub user: Option<String>,
}

/// The task's command, as Mesos's `CommandInfo` carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandSpec {
    /// Run `value` through `/bin/sh -c`.
    pub shell: bool,
    /// The shell command (`shell`) or the program; `None` when the task
    /// gives none (an empty string counts as none, as an unset protobuf
    /// field).
    pub value: Option<String>,
    /// With `value` and not `shell`: the whole argv (argv\[0\] first).
    /// Without `value`: arguments that replace the image's `Cmd`.
    pub arguments: Vec<String>,
}

/// What the container's process runs, with what and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessPlan {
    /// argv; `args[0]` is the program.
    pub args: Vec<String>,
    /// The environment, in the order it was merged (each name once).
    pub env: Vec<(String, String)>,
    /// Working directory, absolute, as the container sees it.
    pub cwd: String,
}

/// Why no command could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// `shell` without a `value` (Mesos: "Shell specified but no command
    /// value provided").
    #[error(
        "CommandInfo.shell is true but CommandInfo.value is empty: give the shell command in value"
    )]
    ShellWithoutValue,
    /// Neither a `value` nor an image `Entrypoint`/`Cmd` (Mesos: "No
    /// executable is found").
    #[error(
        "no executable: CommandInfo.value is empty and the image has neither Entrypoint nor Cmd"
    )]
    NoExecutable,
    /// `arguments[0]` names another program than `value`.
    #[error(
        "CommandInfo.arguments[0] '{argv0}' names another program than CommandInfo.value '{value}': \
         an OCI runtime runs argv[0] as the program, so give arguments[0] equal to value \
         (or the same file name)"
    )]
    Argv0Differs {
        /// The task's `value`.
        value: String,
        /// The task's `arguments[0]`.
        argv0: String,
    },
    /// A relative `WorkingDir` in the image.
    #[error("the image's WorkingDir '{0}' is not an absolute path")]
    RelativeWorkingDir(String),
}

/// argv by the table in this module's doc.
pub fn argv(
    command: &CommandSpec,
    image: Option<&ImageConfig>,
) -> Result<Vec<String>, CommandError> {
    let value = command.value.as_deref().filter(|v| !v.is_empty());
    if command.shell {
        return match value {
            Some(value) => Ok(vec!["/bin/sh".into(), "-c".into(), value.into()]),
            None => Err(CommandError::ShellWithoutValue),
        };
    }
    if let Some(value) = value {
        let Some((argv0, rest)) = command.arguments.split_first() else {
            return Ok(vec![value.to_string()]);
        };
        if argv0 != value && file_name(argv0) != file_name(value) {
            return Err(CommandError::Argv0Differs {
                value: value.into(),
                argv0: argv0.clone(),
            });
        }
        let mut args = vec![value.to_string()];
        args.extend(rest.iter().cloned());
        return Ok(args);
    }
    let image = image.ok_or(CommandError::NoExecutable)?;
    let mut args = if !image.entrypoint.is_empty() {
        image.entrypoint.clone()
    } else if let Some(cmd0) = image.cmd.first() {
        vec![cmd0.clone()]
    } else {
        return Err(CommandError::NoExecutable);
    };
    if !command.arguments.is_empty() {
        args.extend(command.arguments.iter().cloned());
    } else if !image.entrypoint.is_empty() {
        args.extend(image.cmd.iter().cloned());
    } else {
        args.extend(image.cmd.iter().skip(1).cloned());
    }
    Ok(args)
}

/// The whole process: argv, environment and working directory.
/// `sandbox` is the sandbox as the container sees it.
pub fn plan(
    command: &CommandSpec,
    image: Option<&ImageConfig>,
    task_env: &[(String, String)],
    sandbox: &str,
) -> Result<ProcessPlan, CommandError> {
    let args = argv(command, image)?;
    let mut env: Vec<(String, String)> = Vec::new();
    fn set(env: &mut Vec<(String, String)>, name: &str, value: &str) {
        if let Some(slot) = env.iter_mut().find(|(n, _)| n == name) {
            slot.1 = value.to_string();
        } else {
            env.push((name.to_string(), value.to_string()));
        }
    }
    for entry in image.map(|i| i.env.as_slice()).unwrap_or_default() {
        match entry.split_once('=') {
            Some((name, value)) if !name.is_empty() => set(&mut env, name, value),
            _ => tracing::warn!(entry = %entry, "skipping an image Env entry without NAME="),
        }
    }
    for (name, value) in task_env {
        set(&mut env, name, value);
    }
    set(&mut env, "MESOS_SANDBOX", sandbox);
    if !env.iter().any(|(n, _)| n == "PATH") {
        set(&mut env, "PATH", DEFAULT_PATH);
    }
    let cwd = match image
        .and_then(|i| i.working_dir.as_deref())
        .filter(|w| !w.is_empty())
    {
        Some(dir) if dir.starts_with('/') => dir.to_string(),
        Some(dir) => return Err(CommandError::RelativeWorkingDir(dir.into())),
        None => sandbox.to_string(),
    };
    Ok(ProcessPlan { args, env, cwd })
}

fn file_name(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(entrypoint: &[&str], cmd: &[&str]) -> ImageConfig {
        ImageConfig {
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            ..ImageConfig::default()
        }
    }

    fn command(shell: bool, value: Option<&str>, arguments: &[&str]) -> CommandSpec {
        CommandSpec {
            shell,
            value: value.map(String::from),
            arguments: arguments.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    /// The four image columns of the table.
    fn columns() -> [ImageConfig; 4] {
        [
            image(&[], &[]),
            image(&[], &["cmd0", "cmd1"]),
            image(&["ep0", "ep1"], &[]),
            image(&["ep0", "ep1"], &["cmd0", "cmd1"]),
        ]
    }

    #[test]
    fn row_no_shell_no_value_no_arguments() {
        let c = command(false, None, &[]);
        let [none, cmd, ep, both] = columns();
        assert_eq!(argv(&c, Some(&none)), Err(CommandError::NoExecutable));
        assert_eq!(argv(&c, Some(&cmd)).unwrap(), strings(&["cmd0", "cmd1"]));
        assert_eq!(argv(&c, Some(&ep)).unwrap(), strings(&["ep0", "ep1"]));
        assert_eq!(
            argv(&c, Some(&both)).unwrap(),
            strings(&["ep0", "ep1", "cmd0", "cmd1"])
        );
    }

    #[test]
    fn row_no_shell_no_value_arguments_replace_cmd() {
        let c = command(false, None, &["a1", "a2"]);
        let [none, cmd, ep, both] = columns();
        assert_eq!(argv(&c, Some(&none)), Err(CommandError::NoExecutable));
        assert_eq!(
            argv(&c, Some(&cmd)).unwrap(),
            strings(&["cmd0", "a1", "a2"])
        );
        assert_eq!(
            argv(&c, Some(&ep)).unwrap(),
            strings(&["ep0", "ep1", "a1", "a2"])
        );
        assert_eq!(
            argv(&c, Some(&both)).unwrap(),
            strings(&["ep0", "ep1", "a1", "a2"])
        );
    }

    #[test]
    fn rows_no_shell_with_value_ignore_the_image() {
        for image in columns() {
            let alone = command(false, Some("/bin/echo"), &[]);
            assert_eq!(argv(&alone, Some(&image)).unwrap(), strings(&["/bin/echo"]));
            let with = command(false, Some("/bin/echo"), &["/bin/echo", "x"]);
            assert_eq!(
                argv(&with, Some(&image)).unwrap(),
                strings(&["/bin/echo", "x"])
            );
        }
        assert_eq!(
            argv(&command(false, Some("/bin/echo"), &[]), None).unwrap(),
            strings(&["/bin/echo"])
        );
    }

    #[test]
    fn rows_shell_without_value_are_errors() {
        for image in columns() {
            for args in [&[][..], &["a"][..]] {
                assert_eq!(
                    argv(&command(true, None, args), Some(&image)),
                    Err(CommandError::ShellWithoutValue)
                );
            }
        }
        assert_eq!(
            argv(&command(true, Some(""), &[]), None),
            Err(CommandError::ShellWithoutValue)
        );
    }

    #[test]
    fn rows_shell_with_value_run_sh_c_whatever_the_image() {
        for image in columns() {
            for args in [&[][..], &["ignored"][..]] {
                assert_eq!(
                    argv(&command(true, Some("echo $HOME"), args), Some(&image)).unwrap(),
                    strings(&["/bin/sh", "-c", "echo $HOME"])
                );
            }
        }
    }

    #[test]
    fn argv0_is_the_program_or_the_launch_is_refused() {
        // The same file name: argv[0] becomes the full path.
        assert_eq!(
            argv(&command(false, Some("/bin/echo"), &["echo", "hi"]), None).unwrap(),
            strings(&["/bin/echo", "hi"])
        );
        let err = argv(
            &command(false, Some("/bin/busybox"), &["sh", "-c", "x"]),
            None,
        )
        .unwrap_err();
        assert_eq!(
            err,
            CommandError::Argv0Differs {
                value: "/bin/busybox".into(),
                argv0: "sh".into()
            }
        );
        assert!(err.to_string().contains("'sh'") && err.to_string().contains("'/bin/busybox'"));
    }

    #[test]
    fn environment_merges_image_then_task_then_sandbox() {
        let mut img = image(&["/bin/app"], &[]);
        img.env = strings(&["A=image", "B=image", "PATH=/image/bin", "broken", "EQ=x=y"]);
        let task = vec![
            ("B".to_string(), "task".to_string()),
            ("MESOS_SANDBOX".to_string(), "/host/sandbox".to_string()),
            ("C".to_string(), "task".to_string()),
        ];
        let plan = plan(
            &command(false, None, &[]),
            Some(&img),
            &task,
            "/mnt/mesos/sandbox",
        )
        .unwrap();
        let get = |name: &str| {
            plan.env
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("A"), Some("image"));
        assert_eq!(get("B"), Some("task"));
        assert_eq!(get("C"), Some("task"));
        assert_eq!(get("EQ"), Some("x=y"));
        assert_eq!(get("PATH"), Some("/image/bin"));
        assert_eq!(get("MESOS_SANDBOX"), Some("/mnt/mesos/sandbox"));
        assert_eq!(get("broken"), None);
        assert_eq!(plan.env.iter().filter(|(n, _)| n == "B").count(), 1);
    }

    #[test]
    fn path_defaults_to_the_hosts_default() {
        let plan = plan(&command(true, Some("true"), &[]), None, &[], "/sb").unwrap();
        assert!(plan
            .env
            .contains(&("PATH".to_string(), DEFAULT_PATH.to_string())));
    }

    #[test]
    fn working_dir_is_the_images_or_the_sandbox() {
        let mut img = image(&["/bin/app"], &[]);
        let c = command(false, None, &[]);
        assert_eq!(
            plan(&c, Some(&img), &[], "/mnt/mesos/sandbox").unwrap().cwd,
            "/mnt/mesos/sandbox"
        );
        img.working_dir = Some(String::new());
        assert_eq!(
            plan(&c, Some(&img), &[], "/mnt/mesos/sandbox").unwrap().cwd,
            "/mnt/mesos/sandbox"
        );
        img.working_dir = Some("/srv/app".into());
        assert_eq!(
            plan(&c, Some(&img), &[], "/mnt/mesos/sandbox").unwrap().cwd,
            "/srv/app"
        );
        img.working_dir = Some("app".into());
        assert_eq!(
            plan(&c, Some(&img), &[], "/mnt/mesos/sandbox"),
            Err(CommandError::RelativeWorkingDir("app".into()))
        );
    }
}
