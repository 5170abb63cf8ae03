//! Authorization: a local ACL file (`--acls`), in Mesos's shape.
//!
//! ```json
//! {"permissive": false,
//!  "register_frameworks": [{"principals": {"values": ["web"]}, "roles": {"values": ["web"]}}],
//!  "run_tasks": [{"principals": {"type": "NONE"}, "users": {"values": ["root"]}},
//!                {"principals": {"type": "ANY"}, "users": {"type": "ANY"}}],
//!  "teardown_frameworks": [{"principals": {"values": ["ops"]}, "framework_principals": {"type": "ANY"}}],
//!  "view_frameworks": [{"principals": {"type": "ANY"}, "users": {"type": "ANY"}}],
//!  "view_tasks": [{"principals": {"values": ["ops"]}, "users": {"type": "ANY"}}],
//!  "access_sandboxes": [{"principals": {"values": ["ops"]}, "users": {"type": "ANY"}}],
//!  "register_agents": [{"principals": {"values": ["agent"]}, "agents": {"type": "ANY"}}],
//!  "update_quotas": [{"principals": {"values": ["ops"]}, "roles": {"values": ["web"]}}],
//!  "update_weights": [{"principals": {"values": ["ops"]}, "roles": {"type": "ANY"}}],
//!  "view_roles": [{"principals": {"type": "ANY"}, "roles": {"type": "ANY"}}]}
//! ```
//!
//! The master decides all but `access_sandboxes`, which agents decide
//! (reading a sandbox through `/files`, by the user its framework runs
//! as). `register_agents` says which principals may register agents; its
//! object is `agents`, `ANY` or `NONE` only (as in Mesos).
//!
//! An entity is `{"values": [...]}`, `{"type": "ANY"}` or
//! `{"type": "NONE"}`. For an action, the rules are read in order and the
//! first that matches decides: a rule matches when its subject entity
//! matches the subject and its object entity the object (`ANY` and `NONE`
//! match everything, `values` what they list; a request without a
//! principal matches only `ANY` and `NONE`); it allows unless either
//! entity is `NONE`. When no rule matches, `permissive` (default `true`)
//! decides, with one exception: once ACLs are given (`--acls`, even `{}`),
//! a `teardown_frameworks` request that no rule matches is allowed only to
//! the framework's own principal (and, with `permissive: false`, to no
//! one). Without ACLs every request is allowed.

use std::path::Path;

use serde::Deserialize;

/// A set of principals, roles or users.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entity {
    #[serde(default)]
    values: Vec<String>,
    #[serde(default, rename = "type")]
    kind: Option<EntityKind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
enum EntityKind {
    Any,
    None,
}

impl Entity {
    /// Whether the rule applies to `value` (`None`: no principal given).
    fn matches(&self, value: Option<&str>) -> bool {
        match self.kind {
            Some(_) => true,
            None => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
        }
    }

    fn denies(&self) -> bool {
        self.kind == Some(EntityKind::None)
    }
}

/// One rule: a subject entity and an object entity.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    subjects: Entity,
    objects: Entity,
}

/// What an ACL governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A principal registers a framework in a role.
    RegisterFrameworks,
    /// A principal runs a task as a user.
    RunTasks,
    /// An operator tears down a framework of a principal.
    TeardownFrameworks,
    /// An operator sees a framework run as a user.
    ViewFrameworks,
    /// An operator sees a task run as a user.
    ViewTasks,
    /// An operator reads the sandbox of an executor run as a user.
    AccessSandboxes,
    /// A principal registers an agent.
    RegisterAgents,
    /// An operator sets a role's quota (`UPDATE_QUOTA`).
    UpdateQuotas,
    /// An operator sets a role's weight (`UPDATE_WEIGHTS`).
    UpdateWeights,
    /// An operator sees a role, its weight and its quota.
    ViewRoles,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::RegisterFrameworks => "register_frameworks",
            Action::RunTasks => "run_tasks",
            Action::TeardownFrameworks => "teardown_frameworks",
            Action::ViewFrameworks => "view_frameworks",
            Action::ViewTasks => "view_tasks",
            Action::AccessSandboxes => "access_sandboxes",
            Action::RegisterAgents => "register_agents",
            Action::UpdateQuotas => "update_quotas",
            Action::UpdateWeights => "update_weights",
            Action::ViewRoles => "view_roles",
        }
    }
}

/// The ACLs: rules per action and the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acls {
    /// Whether ACLs were given at all (`--acls`): see the module
    /// documentation for what that changes.
    given: bool,
    permissive: bool,
    register_frameworks: Vec<Rule>,
    run_tasks: Vec<Rule>,
    teardown_frameworks: Vec<Rule>,
    view_frameworks: Vec<Rule>,
    view_tasks: Vec<Rule>,
    access_sandboxes: Vec<Rule>,
    register_agents: Vec<Rule>,
    update_quotas: Vec<Rule>,
    update_weights: Vec<Rule>,
    view_roles: Vec<Rule>,
}

impl Default for Acls {
    /// No rules, permissive: everything allowed (no `--acls`).
    fn default() -> Self {
        Acls {
            given: false,
            permissive: true,
            register_frameworks: Vec::new(),
            run_tasks: Vec::new(),
            teardown_frameworks: Vec::new(),
            view_frameworks: Vec::new(),
            view_tasks: Vec::new(),
            access_sandboxes: Vec::new(),
            register_agents: Vec::new(),
            update_quotas: Vec::new(),
            update_weights: Vec::new(),
            view_roles: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default = "yes")]
    permissive: bool,
    #[serde(default)]
    register_frameworks: Vec<RolesRule>,
    #[serde(default)]
    run_tasks: Vec<UsersRule>,
    #[serde(default)]
    teardown_frameworks: Vec<TeardownRule>,
    #[serde(default)]
    view_frameworks: Vec<UsersRule>,
    #[serde(default)]
    view_tasks: Vec<UsersRule>,
    #[serde(default)]
    access_sandboxes: Vec<UsersRule>,
    #[serde(default)]
    register_agents: Vec<AgentsRule>,
    #[serde(default)]
    update_quotas: Vec<RolesRule>,
    #[serde(default)]
    update_weights: Vec<RolesRule>,
    #[serde(default)]
    view_roles: Vec<RolesRule>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RolesRule {
    principals: Entity,
    roles: Entity,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersRule {
    principals: Entity,
    users: Entity,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentsRule {
    principals: Entity,
    agents: Entity,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeardownRule {
    principals: Entity,
    framework_principals: Entity,
}

impl Acls {
    /// Parses ACLs from JSON text, or from the file it names.
    pub fn load(text_or_path: &str) -> Result<Acls, String> {
        let text = if text_or_path.trim_start().starts_with('{') {
            text_or_path.to_string()
        } else {
            std::fs::read_to_string(Path::new(text_or_path))
                .map_err(|e| format!("ACL file {text_or_path}: {e}"))?
        };
        Acls::parse(&text)
    }

    /// Parses ACL JSON.
    pub fn parse(text: &str) -> Result<Acls, String> {
        if !text.trim_start().starts_with('{') {
            return Err("ACLs: expected a JSON object".into());
        }
        let file: File = serde_json::from_str(text).map_err(|e| format!("ACLs: {e}"))?;
        let rules = |list: Vec<(Entity, Entity)>| -> Result<Vec<Rule>, String> {
            list.into_iter()
                .map(|(subjects, objects)| {
                    for e in [&subjects, &objects] {
                        if e.kind.is_some() && !e.values.is_empty() {
                            return Err("ACLs: an entity has either values or a type".to_string());
                        }
                        if e.kind.is_none() && e.values.is_empty() {
                            return Err(
                                "ACLs: an entity needs values, or type ANY or NONE".to_string()
                            );
                        }
                    }
                    Ok(Rule { subjects, objects })
                })
                .collect()
        };
        if file.register_agents.iter().any(|r| r.agents.kind.is_none()) {
            return Err(
                "ACLs: register_agents takes agents of type ANY or NONE, not values".to_string(),
            );
        }
        Ok(Acls {
            given: true,
            permissive: file.permissive,
            register_frameworks: rules(
                file.register_frameworks
                    .into_iter()
                    .map(|r| (r.principals, r.roles))
                    .collect(),
            )?,
            run_tasks: rules(
                file.run_tasks
                    .into_iter()
                    .map(|r| (r.principals, r.users))
                    .collect(),
            )?,
            teardown_frameworks: rules(
                file.teardown_frameworks
                    .into_iter()
                    .map(|r| (r.principals, r.framework_principals))
                    .collect(),
            )?,
            view_frameworks: rules(
                file.view_frameworks
                    .into_iter()
                    .map(|r| (r.principals, r.users))
                    .collect(),
            )?,
            view_tasks: rules(
                file.view_tasks
                    .into_iter()
                    .map(|r| (r.principals, r.users))
                    .collect(),
            )?,
            access_sandboxes: rules(
                file.access_sandboxes
                    .into_iter()
                    .map(|r| (r.principals, r.users))
                    .collect(),
            )?,
            register_agents: rules(
                file.register_agents
                    .into_iter()
                    .map(|r| (r.principals, r.agents))
                    .collect(),
            )?,
            update_quotas: rules(
                file.update_quotas
                    .into_iter()
                    .map(|r| (r.principals, r.roles))
                    .collect(),
            )?,
            update_weights: rules(
                file.update_weights
                    .into_iter()
                    .map(|r| (r.principals, r.roles))
                    .collect(),
            )?,
            view_roles: rules(
                file.view_roles
                    .into_iter()
                    .map(|r| (r.principals, r.roles))
                    .collect(),
            )?,
        })
    }

    fn rules(&self, action: Action) -> &[Rule] {
        match action {
            Action::RegisterFrameworks => &self.register_frameworks,
            Action::RunTasks => &self.run_tasks,
            Action::TeardownFrameworks => &self.teardown_frameworks,
            Action::ViewFrameworks => &self.view_frameworks,
            Action::ViewTasks => &self.view_tasks,
            Action::AccessSandboxes => &self.access_sandboxes,
            Action::RegisterAgents => &self.register_agents,
            Action::UpdateQuotas => &self.update_quotas,
            Action::UpdateWeights => &self.update_weights,
            Action::ViewRoles => &self.view_roles,
        }
    }

    /// Whether `subject` (a principal, or none) may do `action` on
    /// `object` (a role, user or framework principal).
    pub fn allows(&self, action: Action, subject: Option<&str>, object: Option<&str>) -> bool {
        self.rules(action)
            .iter()
            .find(|r| r.subjects.matches(subject) && r.objects.matches(object))
            .map_or_else(
                || self.default_allows(action, subject, object),
                |r| !r.subjects.denies() && !r.objects.denies(),
            )
    }

    /// What decides when no rule matches: `permissive`, but a teardown
    /// under given ACLs is the framework's own principal's only.
    fn default_allows(&self, action: Action, subject: Option<&str>, object: Option<&str>) -> bool {
        match action {
            Action::TeardownFrameworks if self.given => {
                self.permissive && subject.is_some() && subject == object
            }
            _ => self.permissive,
        }
    }

    /// Whether any rule restricts `action` (or the default denies): when
    /// not, every request is allowed and callers may skip the checks.
    pub fn restricts(&self, action: Action) -> bool {
        !self.permissive
            || !self.rules(action).is_empty()
            || (self.given && action == Action::TeardownFrameworks)
    }

    /// `Err` naming what was refused, for messages.
    pub fn check(
        &self,
        action: Action,
        subject: Option<&str>,
        object: Option<&str>,
    ) -> Result<(), String> {
        if self.allows(action, subject, object) {
            Ok(())
        } else {
            let by = subject.map_or("an unauthenticated principal".to_string(), |s| {
                format!("principal {s:?}")
            });
            Err(match (action, object) {
                (Action::RegisterAgents, _) => {
                    format!("not authorized: {} by {by}", action.name())
                }
                (_, object) => format!(
                    "not authorized: {} of {} by {by}",
                    action.name(),
                    object.map_or("(none)".to_string(), |o| format!("{o:?}")),
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acls(json: &str) -> Acls {
        Acls::parse(json).unwrap()
    }

    // After Mesos's authorization tests (`AnyPrincipalRunAsUser`,
    // `PrincipalRunAsSomeUserRestrictive`, the ordering cases).

    #[test]
    fn any_principal_runs_as_a_listed_user() {
        let a =
            acls(r#"{"run_tasks":[{"principals":{"type":"ANY"},"users":{"values":["guest"]}}]}"#);
        assert!(a.allows(Action::RunTasks, Some("foo"), Some("guest")));
        assert!(a.allows(Action::RunTasks, None, Some("guest")));
        // No rule for root; permissive by default.
        assert!(a.allows(Action::RunTasks, Some("foo"), Some("root")));
    }

    #[test]
    fn restrictive_acls_allow_only_what_they_say() {
        let a = acls(
            r#"{"permissive":false,"run_tasks":[{"principals":{"values":["foo"]},"users":{"values":["user1"]}}]}"#,
        );
        assert!(a.allows(Action::RunTasks, Some("foo"), Some("user1")));
        assert!(!a.allows(Action::RunTasks, Some("foo"), Some("user2")));
        assert!(!a.allows(Action::RunTasks, Some("bar"), Some("user1")));
        assert!(!a.allows(Action::RunTasks, None, Some("user1")));
        // Actions without rules follow the default too.
        assert!(!a.allows(Action::RegisterFrameworks, Some("foo"), Some("*")));
        assert!(a.restricts(Action::ViewTasks));
    }

    #[test]
    fn none_denies_and_the_first_match_wins() {
        let a = acls(
            r#"{"run_tasks":[
                {"principals":{"type":"NONE"},"users":{"values":["root"]}},
                {"principals":{"type":"ANY"},"users":{"type":"ANY"}}]}"#,
        );
        assert!(!a.allows(Action::RunTasks, Some("admin"), Some("root")));
        assert!(a.allows(Action::RunTasks, Some("admin"), Some("nobody")));
        // The other order: the catch-all decides first.
        let b = acls(
            r#"{"run_tasks":[
                {"principals":{"type":"ANY"},"users":{"type":"ANY"}},
                {"principals":{"type":"NONE"},"users":{"values":["root"]}}]}"#,
        );
        assert!(b.allows(Action::RunTasks, Some("admin"), Some("root")));
        assert!(!a.restricts(Action::ViewTasks));
        assert!(a.restricts(Action::RunTasks));
    }

    #[test]
    fn roles_teardown_and_views() {
        let a = acls(
            r#"{"register_frameworks":[{"principals":{"values":["web"]},"roles":{"values":["web"]}},
                                       {"principals":{"type":"ANY"},"roles":{"values":["web"]}}],
                "teardown_frameworks":[{"principals":{"values":["ops"]},"framework_principals":{"type":"ANY"}},
                                       {"principals":{"type":"ANY"},"framework_principals":{"type":"NONE"}}],
                "view_tasks":[{"principals":{"values":["ops"]},"users":{"type":"ANY"}},
                              {"principals":{"type":"ANY"},"users":{"type":"NONE"}}]}"#,
        );
        assert!(a.allows(Action::RegisterFrameworks, Some("web"), Some("web")));
        // The second rule matches any other principal for role web, and
        // lists the role: allowed. A principal-less request matches it too.
        assert!(a.allows(Action::RegisterFrameworks, Some("batch"), Some("web")));
        assert!(a.allows(Action::RegisterFrameworks, Some("batch"), Some("batch")));
        assert!(a.allows(Action::TeardownFrameworks, Some("ops"), Some("web")));
        assert!(!a.allows(Action::TeardownFrameworks, Some("dev"), Some("web")));
        assert!(a.allows(Action::ViewTasks, Some("ops"), Some("root")));
        assert!(!a.allows(Action::ViewTasks, Some("dev"), Some("root")));
        let message = a
            .check(Action::ViewTasks, Some("dev"), Some("root"))
            .unwrap_err();
        assert!(
            message.contains("view_tasks") && message.contains("dev"),
            "{message}"
        );
    }

    #[test]
    fn teardown_is_the_owners_once_acls_are_given() {
        // Without ACLs, anyone (as today).
        let none = Acls::default();
        assert!(!none.restricts(Action::TeardownFrameworks));
        assert!(none.allows(Action::TeardownFrameworks, None, Some("alice")));
        // Given, even `{}`: the framework's own principal only.
        let given = acls("{}");
        assert!(given.restricts(Action::TeardownFrameworks));
        assert!(given.allows(Action::TeardownFrameworks, Some("alice"), Some("alice")));
        assert!(!given.allows(Action::TeardownFrameworks, Some("bob"), Some("alice")));
        assert!(!given.allows(Action::TeardownFrameworks, None, Some("alice")));
        assert!(!given.allows(Action::TeardownFrameworks, None, None));
        // Other actions keep `permissive`.
        assert!(given.allows(Action::ViewTasks, Some("bob"), Some("alice")));
        // A rule still decides first.
        let ops = acls(
            r#"{"teardown_frameworks":[{"principals":{"values":["ops"]},"framework_principals":{"type":"ANY"}}]}"#,
        );
        assert!(ops.allows(Action::TeardownFrameworks, Some("ops"), Some("alice")));
        assert!(ops.allows(Action::TeardownFrameworks, Some("bob"), Some("bob")));
        assert!(!ops.allows(Action::TeardownFrameworks, Some("bob"), Some("alice")));
        // Not permissive: no one but whom the rules name.
        let strict = acls(r#"{"permissive":false}"#);
        assert!(!strict.allows(Action::TeardownFrameworks, Some("alice"), Some("alice")));
    }

    #[test]
    fn register_agents_names_the_agents_principals() {
        let a = acls(
            r#"{"register_agents":[{"principals":{"values":["agent"]},"agents":{"type":"ANY"}},
                                   {"principals":{"type":"ANY"},"agents":{"type":"NONE"}}]}"#,
        );
        assert!(a.restricts(Action::RegisterAgents));
        assert!(a.allows(Action::RegisterAgents, Some("agent"), None));
        assert!(!a.allows(Action::RegisterAgents, Some("alice"), None));
        assert!(!a.allows(Action::RegisterAgents, None, None));
        let message = a
            .check(Action::RegisterAgents, Some("alice"), None)
            .unwrap_err();
        assert!(
            message.contains("register_agents") && message.contains("alice"),
            "{message}"
        );
        assert!(!acls("{}").restricts(Action::RegisterAgents));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for bad in [
            "",
            "[]",
            r#"{"run_task":[]}"#,
            r#"{"run_tasks":[{"principals":{"type":"ANY"}}]}"#,
            r#"{"run_tasks":[{"principals":{"type":"SOME"},"users":{"type":"ANY"}}]}"#,
            r#"{"run_tasks":[{"principals":{},"users":{"type":"ANY"}}]}"#,
            r#"{"run_tasks":[{"principals":{"type":"ANY","values":["a"]},"users":{"type":"ANY"}}]}"#,
        ] {
            assert!(Acls::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Acls::parse("{}").map(|a| a.restricts(Action::RunTasks)),
            Ok(false)
        );
        assert!(Acls::parse(
            r#"{"register_agents":[{"principals":{"type":"ANY"},"agents":{"values":["a"]}}]}"#
        )
        .unwrap_err()
        .contains("register_agents"));
        assert!(Acls::load("/nonexistent/acls.json")
            .unwrap_err()
            .contains("/nonexistent/acls.json"));
    }
}
