//! Principals and forged registrations. Every framework and agent of the
//! simulation has a principal of its own (as if authenticated); a forger
//! is a connection that, under some other principal (another framework's,
//! an agent's, a stranger's or none), re-subscribes as a live framework
//! or re-registers as a live agent. The master must refuse it with no
//! effect on the victim: the `IDENTITY` invariant (see `check.rs`).

use agora_master::sim::{Bound, Input, Output};
use agora_proto::agent as agent_api;
use agora_proto::scheduler as sched_api;
use agora_proto::{AgentInfo, PROTOCOL_VERSION};

use crate::check::IDENTITY;
use crate::world::{ConnKind, Msg, Side, World};

/// Who a connection is, as the master would authenticate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Principal {
    /// Framework `f`'s scheduler.
    Framework(usize),
    /// Agent `i`.
    Agent(usize),
    /// A principal no framework or agent has.
    Stranger,
    /// No principal (an unauthenticated peer).
    Anonymous,
}

/// What a forger claims to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Victim {
    Framework(usize),
    Agent(usize),
}

// === impl Principal ===

impl Principal {
    /// Its name, as the master records it.
    pub(crate) fn name(self) -> Option<String> {
        match self {
            Principal::Framework(f) => Some(format!("fw-{f}")),
            Principal::Agent(i) => Some(format!("agent-{i}")),
            Principal::Stranger => Some("mallory".into()),
            Principal::Anonymous => None,
        }
    }

    /// The principal a connection acts under.
    pub(crate) fn of(kind: ConnKind) -> Principal {
        match kind {
            ConnKind::Sched { fw, .. } => Principal::Framework(fw),
            ConnKind::Agent { agent, .. } => Principal::Agent(agent),
            ConnKind::Forger { principal, .. } => principal,
            // Executors talk to agents, never as a principal of the master.
            ConnKind::Exec { .. } => Principal::Anonymous,
        }
    }
}

// === impl World: forgeries ===

impl World {
    /// A forger under `principal` claims to be `victim`: a SUBSCRIBE
    /// naming the framework's id (with force, a takeover), or a REGISTER
    /// with the agent's id. Nothing happens when the victim has no id
    /// yet or the master is down.
    pub(crate) fn forge(&mut self, victim: Victim, principal: Principal) {
        if !self.master.up {
            return;
        }
        let (agent, msg) = match victim {
            Victim::Framework(f) => {
                let Some(id) = self.fws[f].info.id.clone() else {
                    return;
                };
                let mut info = self.fws[f].info.clone();
                info.id = Some(id);
                info.principal = principal.name();
                let call = sched_api::Call::Subscribe {
                    protocol: PROTOCOL_VERSION,
                    framework_info: info,
                    force: true,
                };
                (false, Msg::SchedCall(Box::new(call), Vec::new()))
            }
            Victim::Agent(i) => {
                let Some(id) = self.agents[i].id.clone() else {
                    return;
                };
                let call = agent_api::Call::Register {
                    protocol: PROTOCOL_VERSION,
                    agent_info: AgentInfo {
                        id: Some(id),
                        hostname: format!("forged-h{i}"),
                        address: "forger:5051".into(),
                        resources: self.agents[i].config.resources.clone(),
                        attributes: Default::default(),
                    },
                    tasks: Vec::new(),
                    executors: Vec::new(),
                    frameworks: Vec::new(),
                };
                (true, Msg::AgentCall(Box::new(call)))
            }
        };
        let conn = self.open(ConnKind::Forger {
            master: self.master.inc,
            agent,
            principal,
        });
        self.note(|| format!("forger {principal:?} claims to be {victim:?} on conn {conn}"));
        self.send(conn, Side::Client, msg);
    }

    /// A forger hears from the master: a refusal (an error, or the
    /// shutdown of a removed agent's id) and nothing else. It hangs up.
    pub(crate) fn forger_heard(&mut self, conn: u64, principal: Principal, msg: Msg) {
        let refused = match &msg {
            Msg::SchedEvent(e, _) => matches!(**e, sched_api::Event::Error { .. }),
            Msg::AgentEvent(e) => matches!(
                **e,
                agent_api::Event::Error { .. } | agent_api::Event::Shutdown { .. }
            ),
            _ => false,
        };
        if !refused {
            self.violated(
                IDENTITY,
                format!(
                    "forger {principal:?} on conn {conn} was answered {} (not a refusal)",
                    crate::world::msg_type(&msg)
                ),
            );
        }
        self.close(conn, Side::Client, "forger done");
    }

    /// The forger connection an input comes from, if any.
    pub(crate) fn forger_of(&self, input: &Input) -> Option<u64> {
        let conn = match input {
            Input::Scheduler { conn, .. }
            | Input::SchedulerClosed { conn }
            | Input::Agent { conn, .. }
            | Input::AgentClosed { conn } => *conn,
            _ => return None,
        };
        matches!(
            self.conns.get(&conn).map(|c| c.kind),
            Some(ConnKind::Forger { .. })
        )
        .then_some(conn)
    }

    /// Hands `input` to the master and, when a forger sent it, checks it
    /// changed no binding and that every output it made (those the outbox
    /// gained) went to the forger.
    pub(crate) fn master_handle(&mut self, now: tokio::time::Instant, input: Input) {
        let forger = self.forger_of(&input);
        let Some(core) = self.master.core.as_mut() else {
            return;
        };
        let before = forger.map(|_| core.bindings());
        core.handle(now, input);
        let (Some(forger), Some(before)) = (forger, before) else {
            return;
        };
        let after = core.bindings();
        let outputs = core.peek_outputs();
        let stray = outputs.iter().find(|output| {
            let conn = match output {
                Output::Scheduler { conn, .. }
                | Output::Agent { conn, .. }
                | Output::Close { conn, .. } => *conn,
            };
            conn != forger
        });
        if after != before {
            self.violated(
                IDENTITY,
                format!("a forged call on conn {forger} changed who acts as what: before {before:?}, after {after:?}"),
            );
        } else if let Some(output) = stray {
            let detail =
                format!("a forged call on conn {forger} reached another connection: {output:?}");
            self.violated(IDENTITY, detail);
        }
    }

    /// After a step: every connection the master takes calls from as a
    /// framework or agent is that framework's or agent's own (its
    /// principal is the one bound to it), and a framework's or agent's
    /// principal never changes.
    pub(crate) fn check_identity(&mut self) -> Result<(), (&'static str, String)> {
        let Some(core) = self.master.core.as_ref() else {
            return Ok(());
        };
        for binding in core.bindings() {
            let Some(kind) = self.conns.get(&binding.conn).map(|c| c.kind) else {
                continue;
            };
            let principal = Principal::of(kind);
            if principal.name() != binding.principal {
                return Err((
                    IDENTITY,
                    format!(
                        "conn {} of {principal:?} acts as {:?}, bound to principal {:?}",
                        binding.conn, binding.bound, binding.principal
                    ),
                ));
            }
            let owner_kind_matches = matches!(
                (&binding.bound, kind),
                (Bound::Framework(_), ConnKind::Sched { .. })
                    | (Bound::Agent(_), ConnKind::Agent { .. })
            );
            if !owner_kind_matches {
                return Err((
                    IDENTITY,
                    format!(
                        "conn {} ({kind:?}) acts as {:?}",
                        binding.conn, binding.bound
                    ),
                ));
            }
        }
        let frameworks = core.framework_principals();
        let agents = core.agent_principals();
        self.check.principals(&frameworks, &agents)
    }
}
