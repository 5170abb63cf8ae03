//! `agora`, the operator's command line: lists of agents, frameworks and
//! tasks read from the master's paginated `/api/v1/*` endpoints (a table by
//! default, `--json` for scripts), a task's sandbox logs read from its
//! agent's `/files/…` (optionally followed until the task ends), and the
//! `execute` / `local` jobs of `agora-execute` and `agora-local` with a
//! progress bar.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agora_client::MasterClient;
use agora_discovery::MasterLocator;
use agora_examples::execute::{execute, ExecuteOptions, ExecuteReport, StateHook};
use agora_proto::{TaskId, TaskState};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

pub use agora_client::encode;

/// Bytes read per `/files` request.
const LOG_CHUNK: u64 = 1024 * 1024;
/// How often `task log --follow` polls.
const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// One column of a table: its heading and how to get it from an item.
pub struct Column {
    /// Heading.
    pub title: &'static str,
    /// The cell's text.
    pub cell: fn(&Value) -> String,
}

/// The master at `addr`: `HOST:PORT`, or with the `etcd` feature
/// `etcd://HOST:PORT/PREFIX`, the current leader.
/// Requests present `credential` when given (a master with
/// `--authenticate-http`), over HTTPS with `tls`.
pub async fn master(
    addr: &str,
    credential: Option<&agora_proto::Credential>,
    tls: Option<&std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
) -> anyhow::Result<MasterClient> {
    let locator = MasterLocator::new(addr)?;
    let located = locator.locate(None).await?;
    let mut http = agora_client::Http::new();
    if let Some(tls) = tls {
        http = http.with_tls(tls.clone());
    }
    if let Some(credential) = credential {
        http = http.with_authorization(&credential.authorization())?;
    }
    Ok(MasterClient::with_http(http, located.address))
}

/// Imports the `docker save` or OCI-layout tarball `file` into the image
/// store of the agent at `agent` (`POST /images/import`), presenting
/// `credential` when given, over HTTPS with `tls`; returns the agent's
/// answer (`{"images": [{"names", "digest", "layers"}]}`).
pub async fn import_image(
    agent: &str,
    file: &std::path::Path,
    credential: Option<&agora_proto::Credential>,
    tls: Option<&std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
) -> anyhow::Result<serde_json::Value> {
    let body = tokio::fs::read(file)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut http = agora_client::Http::new().with_timeout(std::time::Duration::from_secs(600));
    if let Some(tls) = tls {
        http = http.with_tls(tls.clone());
    }
    if let Some(credential) = credential {
        http = http.with_authorization(&credential.authorization())?;
    }
    let response = http
        .post(agent, "/images/import", "application/x-tar", body)
        .await?;
    if response.status != 200 {
        anyhow::bail!(
            "agent {agent} refused the import ({}): {}",
            response.status,
            response.text().trim()
        );
    }
    Ok(response.json()?)
}

/// Every item of a paginated list endpoint (`query` without `offset`/`limit`).
pub async fn list_all(
    master: &MasterClient,
    endpoint: &str,
    query: &str,
) -> anyhow::Result<Vec<Value>> {
    Ok(master.list(endpoint, query).await?)
}

/// Renders items as an aligned text table.
pub fn table(items: &[Value], columns: &[Column]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| columns.iter().map(|c| (c.cell)(item)).collect())
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.title.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(columns.iter().map(|c| c.title).collect(), &mut out);
    for row in &rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// Prints items as a table, or as a JSON array with `json`.
pub fn print_items(items: &[Value], columns: &[Column], json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, items)?;
        writeln!(out)?;
    } else {
        out.write_all(table(items, columns).as_bytes())?;
    }
    Ok(())
}

fn yes_no(v: &Value) -> String {
    if *v == true { "yes" } else { "no" }.to_string()
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn short_state(v: &Value) -> String {
    s(v).trim_start_matches("TASK_").to_string()
}

/// Columns of `agora agents`.
pub const AGENT_COLUMNS: &[Column] = &[
    Column {
        title: "ID",
        cell: |a| s(&a["id"]),
    },
    Column {
        title: "HOSTNAME",
        cell: |a| s(&a["hostname"]),
    },
    Column {
        title: "ADDRESS",
        cell: |a| s(&a["address"]),
    },
    Column {
        title: "CONNECTED",
        cell: |a| yes_no(&a["connected"]),
    },
    Column {
        title: "UNAVAILABLE",
        cell: |a| match a["unavailable"].as_str() {
            Some(why) => why.to_string(),
            None => "-".to_string(),
        },
    },
    Column {
        title: "TASKS",
        cell: |a| s(&a["tasks"]),
    },
    Column {
        title: "USED",
        cell: |a| s(&a["used"]["text"]),
    },
    Column {
        title: "TOTAL",
        cell: |a| s(&a["total"]["text"]),
    },
];

/// Columns of `agora frameworks`.
pub const FRAMEWORK_COLUMNS: &[Column] = &[
    Column {
        title: "ID",
        cell: |f| s(&f["id"]),
    },
    Column {
        title: "NAME",
        cell: |f| s(&f["name"]),
    },
    Column {
        title: "ROLES",
        cell: |f| {
            f["roles"]
                .as_array()
                .map(|r| r.iter().map(s).collect::<Vec<_>>().join(","))
                .unwrap_or_default()
        },
    },
    Column {
        title: "CONNECTED",
        cell: |f| yes_no(&f["connected"]),
    },
    Column {
        title: "TASKS",
        cell: |f| s(&f["tasks"]),
    },
    Column {
        title: "OFFERS",
        cell: |f| s(&f["offers"]),
    },
    Column {
        title: "USED",
        cell: |f| s(&f["used"]["text"]),
    },
    Column {
        title: "SHARES",
        cell: |f| {
            f["shares"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(role, v)| match v.as_f64() {
                            Some(x) => format!("{role}={x:.3}"),
                            None => format!("{role}=-"),
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default()
        },
    },
];

/// Columns of `agora tasks`.
pub const TASK_COLUMNS: &[Column] = &[
    Column {
        title: "ID",
        cell: |t| s(&t["id"]),
    },
    Column {
        title: "STATE",
        cell: |t| short_state(&t["state"]),
    },
    Column {
        title: "NAME",
        cell: |t| s(&t["name"]),
    },
    Column {
        title: "FRAMEWORK",
        cell: |t| s(&t["framework_id"]),
    },
    Column {
        title: "AGENT",
        cell: |t| match t["agent_hostname"].as_str() {
            Some(h) => h.to_string(),
            None => s(&t["agent_id"]),
        },
    },
    Column {
        title: "RESOURCES",
        cell: |t| s(&t["resources"]["text"]),
    },
];

/// Finds one task by id (and framework, when ids repeat across frameworks).
pub async fn find_task(
    master: &MasterClient,
    task_id: &str,
    framework_id: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let mut query = format!("q={}", encode(task_id));
    if let Some(f) = framework_id {
        query.push_str(&format!("&framework_id={}", encode(f)));
    }
    let mut matches: Vec<Value> = list_all(master, "/api/v1/tasks", &query)
        .await?
        .into_iter()
        .filter(|t| t["id"] == task_id)
        .collect();
    match matches.len() {
        0 => bail!("no task {task_id} is known to the master (completed tasks age out)"),
        1 => Ok(matches.remove(0)),
        n => bail!("{n} frameworks have a task {task_id}: choose one with --framework"),
    }
}

/// Prints a task's sandbox file from its agent; with `follow`, keeps
/// printing what is appended until the task is terminal and the file
/// is read to its end.
pub async fn task_log(
    master: &MasterClient,
    task_id: &str,
    framework_id: Option<&str>,
    file: &str,
    follow: bool,
) -> anyhow::Result<()> {
    let mut task = find_task(master, task_id, framework_id).await?;
    let agent = task["agent_address"]
        .as_str()
        .context("the task's agent is no longer known to the master")?;
    let agent = master.agent(agent);
    let fid = s(&task["framework_id"]);
    let eid = s(&task["executor_id"]);
    let mut offset: u64 = 0;
    let mut out = std::io::stdout().lock();
    loop {
        let chunk = agent
            .file(&fid, &eid, file, offset, LOG_CHUNK)
            .await
            .with_context(|| format!("reading {file} of task {task_id}"))?;
        if chunk.size < offset {
            // Rotated (`--container-logger logrotate`): the new file is
            // read from its start.
            offset = 0;
            continue;
        }
        out.write_all(chunk.data.as_bytes())?;
        out.flush()?;
        offset = chunk.offset + chunk.length;
        if !chunk.eof {
            continue;
        }
        if !follow || terminal(&task) {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_POLL).await;
        // Its state decides when following ends; the read after it turned
        // terminal picks up the last output.
        if let Ok(t) = find_task(master, task_id, Some(&fid)).await {
            task = t;
        }
    }
}

fn terminal(task: &Value) -> bool {
    serde_json::from_value::<TaskState>(task["state"].clone()).is_ok_and(|s| s.is_terminal())
}

/// Counts of a job's instances by where they are, for the progress bar.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobProgress {
    latest: BTreeMap<TaskId, TaskState>,
}

impl JobProgress {
    /// Records a task's state; a terminal state is final.
    pub fn record(&mut self, task: &TaskId, state: TaskState) {
        let entry = self.latest.entry(task.clone()).or_insert(state);
        if !entry.is_terminal() {
            *entry = state;
        }
    }

    /// (staged, running, finished, failed): staged covers staging and
    /// starting, failed every terminal state but finished.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for state in self.latest.values() {
            match state {
                TaskState::Staging | TaskState::Starting => c.0 += 1,
                TaskState::Running | TaskState::Killing => c.1 += 1,
                TaskState::Finished => c.2 += 1,
                _ => c.3 += 1,
            }
        }
        c
    }
}

/// Runs a job like `agora-execute` with a progress bar on stderr (hidden
/// when stderr is not a terminal). With `verbose`, each update is printed
/// above the bar.
pub async fn execute_with_progress(
    mut opts: ExecuteOptions,
    verbose: bool,
) -> anyhow::Result<ExecuteReport> {
    let bar = ProgressBar::new(opts.instances as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} done  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_message("staged 0, running 0, finished 0, failed 0");
    let progress = Arc::new(Mutex::new(JobProgress::default()));
    let hook_bar = bar.clone();
    opts.print_updates = false;
    opts.on_state = Some(StateHook(Arc::new(move |task, state| {
        let mut p = progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        p.record(task, state);
        let (staged, running, finished, failed) = p.counts();
        hook_bar.set_position((finished + failed) as u64);
        hook_bar.set_message(format!(
            "staged {staged}, running {running}, finished {finished}, failed {failed}"
        ));
        if verbose {
            hook_bar.println(format!("{task} {state}"));
        }
    })));
    let result = execute(opts).await;
    bar.finish_and_clear();
    result
}

/// `NAME:VALUE;NAME:VALUE` (`cpus:2;mem:1024`) as a Mesos
/// `map<string, Value.Scalar>`; zero is a value (a limit of nothing).
pub fn scalar_map(text: &str) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut out = serde_json::Map::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = part.split_once(':') else {
            bail!("expected NAME:VALUE, not {part:?}");
        };
        let value: f64 = value
            .trim()
            .parse()
            .with_context(|| format!("the value of {name} in {part:?}"))?;
        out.insert(
            name.trim().to_string(),
            serde_json::json!({ "value": value }),
        );
    }
    Ok(out)
}

/// `agora quota set`: one role's guarantees and limits (`UPDATE_QUOTA`);
/// neither removes the role's quota.
pub async fn quota_set(
    master: &MasterClient,
    role: &str,
    guarantee: Option<&str>,
    limit: Option<&str>,
    force: bool,
) -> anyhow::Result<()> {
    let guarantees = scalar_map(guarantee.unwrap_or_default())?;
    let limits = scalar_map(limit.unwrap_or_default())?;
    let call = serde_json::json!({
        "type": "UPDATE_QUOTA",
        "update_quota": {
            "force": force,
            "quota_configs": [{"role": role, "guarantees": guarantees, "limits": limits}],
        }
    });
    master.operator_call(&call).await?;
    Ok(())
}

/// `agora quota get`: every role's quota (`GET_QUOTA`), as rows of
/// `role`, `guarantees` and `limits` (Mesos's `name:value;…` text).
pub async fn quota_get(master: &MasterClient) -> anyhow::Result<Vec<Value>> {
    let answer = master
        .operator_call(&serde_json::json!({"type": "GET_QUOTA"}))
        .await?;
    let text = |m: &Value| {
        m.as_object()
            .map(|m| {
                m.iter()
                    // The JSON codec leaves a zero value out.
                    .map(|(k, v)| format!("{k}:{:?}", v["value"].as_f64().unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(";")
            })
            .unwrap_or_default()
    };
    Ok(answer["get_quota"]["status"]["configs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            serde_json::json!({
                "role": c["role"],
                "guarantees": text(&c["guarantees"]),
                "limits": text(&c["limits"]),
            })
        })
        .collect())
}

/// Columns of `agora quota get`.
pub const QUOTA_COLUMNS: &[Column] = &[
    Column {
        title: "ROLE",
        cell: |v| v["role"].as_str().unwrap_or_default().to_string(),
    },
    Column {
        title: "GUARANTEES",
        cell: |v| v["guarantees"].as_str().unwrap_or_default().to_string(),
    },
    Column {
        title: "LIMITS",
        cell: |v| v["limits"].as_str().unwrap_or_default().to_string(),
    },
];

/// `agora weights set ROLE=W …` (`UPDATE_WEIGHTS`).
pub async fn weights_set(master: &MasterClient, weights: &[String]) -> anyhow::Result<()> {
    let mut infos = Vec::new();
    for w in weights {
        let Some((role, weight)) = w.split_once('=') else {
            bail!("expected ROLE=WEIGHT, not {w:?}");
        };
        let weight: f64 = weight
            .parse()
            .with_context(|| format!("the weight in {w:?}"))?;
        infos.push(serde_json::json!({"role": role, "weight": weight}));
    }
    let call = serde_json::json!({
        "type": "UPDATE_WEIGHTS",
        "update_weights": {"weight_infos": infos},
    });
    master.operator_call(&call).await?;
    Ok(())
}

/// `agora weights get`: the roles whose weight was set (`GET_WEIGHTS`).
pub async fn weights_get(master: &MasterClient) -> anyhow::Result<Vec<Value>> {
    let answer = master
        .operator_call(&serde_json::json!({"type": "GET_WEIGHTS"}))
        .await?;
    Ok(answer["get_weights"]["weight_infos"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Columns of `agora weights get`.
pub const WEIGHT_COLUMNS: &[Column] = &[
    Column {
        title: "ROLE",
        cell: |v| v["role"].as_str().unwrap_or_default().to_string(),
    },
    Column {
        title: "WEIGHT",
        cell: |v| v["weight"].to_string(),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns() {
        let items = vec![
            json!({"id": "t1", "state": "TASK_RUNNING", "name": "a", "framework_id": "f", "agent_hostname": "h", "resources": {"text": "cpus:1"}}),
            json!({"id": "task-22", "state": "TASK_FINISHED", "name": "b", "framework_id": "f", "agent_id": "s1", "resources": {"text": ""}}),
        ];
        let t = table(&items, TASK_COLUMNS);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "ID       STATE     NAME  FRAMEWORK  AGENT  RESOURCES"
        );
        assert_eq!(
            lines[1],
            "t1       RUNNING   a     f          h      cpus:1"
        );
        assert_eq!(lines[2], "task-22  FINISHED  b     f          s1");
    }

    #[test]
    fn progress_counts_latest_states_and_keeps_terminal_ones() {
        let mut p = JobProgress::default();
        let (a, b, c) = (TaskId::new("a"), TaskId::new("b"), TaskId::new("c"));
        p.record(&a, TaskState::Staging);
        p.record(&b, TaskState::Staging);
        p.record(&c, TaskState::Staging);
        assert_eq!(p.counts(), (3, 0, 0, 0));
        p.record(&a, TaskState::Running);
        p.record(&b, TaskState::Failed);
        p.record(&b, TaskState::Running);
        p.record(&c, TaskState::Finished);
        assert_eq!(p.counts(), (0, 1, 1, 1));
    }
}

/// What `agora agent` does to an agent (the master's v1 operator calls).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentAction {
    /// DRAIN_AGENT: tasks killed after `grace` (at once without), no new
    /// tasks; with `mark_gone`, the agent is marked gone once drained.
    Drain {
        grace: Option<Duration>,
        mark_gone: bool,
    },
    /// DEACTIVATE_AGENT: no offers; tasks go on.
    Deactivate,
    /// REACTIVATE_AGENT: offered again (ends a drain).
    Reactivate,
    /// MARK_AGENT_GONE: tasks end, the agent is refused from then on.
    MarkGone,
}

/// The v1 operator call (JSON, as Mesos's tools send it) for `action`
/// on agent `agent_id`.
pub fn agent_call(agent_id: &str, action: &AgentAction) -> Value {
    let id = serde_json::json!({ "value": agent_id });
    match action {
        AgentAction::Drain { grace, mark_gone } => {
            let mut drain = serde_json::json!({ "agent_id": id, "mark_gone": mark_gone });
            if let Some(grace) = grace {
                // google.protobuf.Duration in JSON: "1.5s".
                drain["max_grace_period"] = serde_json::json!(format!("{}s", grace.as_secs_f64()));
            }
            serde_json::json!({ "type": "DRAIN_AGENT", "drain_agent": drain })
        }
        AgentAction::Deactivate => {
            serde_json::json!({ "type": "DEACTIVATE_AGENT", "deactivate_agent": { "agent_id": id } })
        }
        AgentAction::Reactivate => {
            serde_json::json!({ "type": "REACTIVATE_AGENT", "reactivate_agent": { "agent_id": id } })
        }
        AgentAction::MarkGone => {
            serde_json::json!({ "type": "MARK_AGENT_GONE", "mark_agent_gone": { "agent_id": id } })
        }
    }
}

/// Sends `action` on agent `agent_id` to the master's `/api/v1`; the
/// master's refusal (unknown agent, not authenticated, ...) is the error.
pub async fn agent_action(
    master: &MasterClient,
    agent_id: &str,
    action: &AgentAction,
) -> anyhow::Result<()> {
    let response = master
        .post_json("/api/v1", &agent_call(agent_id, action))
        .await?;
    if response.status != 200 {
        bail!(
            "the master refused ({}): {}",
            response.status,
            response.text().trim()
        );
    }
    Ok(())
}
