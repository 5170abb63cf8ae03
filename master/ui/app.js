// Agora web UI: a dependency-free single page served by the master.
//
// Data comes from the master's /api/v1/{summary,agents,frameworks,tasks}
// (paginated, filtered server-side, so 10 000 agents and 100 000 tasks cost
// one page each) and its /events stream (server-sent events, about one per
// second), which drives the overview, the utilisation chart and the
// refresh of whatever list is on screen. A task's stdout/stderr is read from
// its agent's /files endpoint (the agent allows cross-origin reads).
"use strict";

const PAGE = 50;
const HISTORY = 600; // utilisation samples kept (about ten minutes)
const LOG_TAIL = 64 * 1024; // bytes of a log shown when it is opened
const LOG_POLL_MS = 1000;

const view = document.getElementById("view");
const live = document.getElementById("live");
const footer = document.getElementById("footer");

let latest = null; // the latest summary event
const samples = []; // {t, cpusUsed, cpusTotal, memUsed, memTotal}
let refreshCurrent = null; // re-renders the current list page on updates
let stopCurrent = null; // stops timers of the current page

// --- helpers ---

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`);
  return r.json();
}

function fmt(n, digits = 1) {
  if (n === undefined || n === null) return "–";
  return Number.isInteger(n) ? String(n) : n.toFixed(digits);
}

function ago(ts) {
  if (!ts) return "";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function stateCell(state) {
  return h("span", { class: `state ${state}` }, state.replace(/^TASK_/, ""));
}

function bar(used, total) {
  const pct = total > 0 ? Math.min(100, (100 * used) / total) : 0;
  return h("div", { class: "bar", title: `${fmt(used)} / ${fmt(total)}` },
    h("div", { style: `width:${pct.toFixed(1)}%` }));
}

function taskHref(t) {
  return `#/task/${encodeURIComponent(t.framework_id)}/${encodeURIComponent(t.id)}`;
}

function params() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

function setParams(base, p) {
  const s = p.toString();
  window.history.replaceState(null, "", `${base}${s ? "?" + s : ""}`);
}

// --- live updates ---

function connectEvents() {
  const es = new EventSource("/events");
  es.addEventListener("summary", (e) => {
    live.textContent = "live";
    live.classList.add("on");
    latest = JSON.parse(e.data);
    const s = latest.summary;
    samples.push({
      t: latest.generated_at,
      cpusUsed: s.cpus_used, cpusTotal: s.cpus_total,
      memUsed: s.mem_used, memTotal: s.mem_total,
    });
    while (samples.length > HISTORY) samples.shift();
    footer.textContent = `master ${latest.master.id} at ${latest.master.address}, version ${latest.master.version}; started ${ago(latest.started_at)}`;
    if (refreshCurrent) refreshCurrent();
  });
  es.onerror = () => {
    live.textContent = "reconnecting…";
    live.classList.remove("on");
  };
}

// --- pages ---

function overview() {
  const cards = h("div", { class: "cards", id: "summary-cards" });
  const canvas = h("canvas", { id: "utilisation", width: 1200, height: 220 });
  const roles = h("tbody");
  view.replaceChildren(
    h("h1", {}, "Cluster"),
    cards,
    h("div", { class: "panel" },
      h("h2", {}, "Utilisation over time"),
      h("div", { class: "legend" },
        h("span", {}, h("i", { style: "background:#2f6fb3" }), "cpus used / total"),
        h("span", {}, h("i", { style: "background:#2e8540" }), "mem used / total")),
      canvas),
    h("h2", {}, "Roles"),
    h("table", {}, h("thead", {}, h("tr", {}, ["role", "weight", "weighted share", "frameworks"].map((c) => h("th", {}, c)))), roles),
  );
  refreshCurrent = () => {
    if (!latest) return;
    const s = latest.summary;
    const card = (n, l, id) => h("div", { class: "card", id }, h("div", { class: "n" }, n), h("div", { class: "l" }, l));
    const tasks = Object.entries(s.tasks_by_state).map(([k, v]) => card(v, `tasks ${k.replace(/^TASK_/, "").toLowerCase()}`, `card-${k}`));
    cards.replaceChildren(
      card(s.agents_connected, "agents connected", "card-agents"),
      card(s.agents_disconnected, "agents disconnected"),
      card(`${s.frameworks_connected}/${s.frameworks}`, "frameworks connected"),
      card(s.tasks_active, "active tasks", "card-tasks"),
      card(`${fmt(s.cpus_used)} / ${fmt(s.cpus_total)}`, "cpus used / total"),
      card(`${fmt(s.mem_used, 0)} / ${fmt(s.mem_total, 0)}`, "mem (MiB) used / total"),
      card(s.offers_outstanding, "offers outstanding"),
      ...tasks,
    );
    roles.replaceChildren(...latest.roles.map((r) => h("tr", {},
      h("td", {}, r.name), h("td", {}, fmt(r.weight)),
      h("td", {}, r.share === null ? "–" : fmt(r.share, 3)),
      h("td", {}, r.frameworks.length))));
    drawChart(canvas);
  };
  refreshCurrent();
}

function drawChart(canvas) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, hgt = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, hgt);
  ctx.strokeStyle = "#dde3ea";
  ctx.fillStyle = "#6b7785";
  ctx.font = "12px system-ui";
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const y = hgt - pad - f * (hgt - 2 * pad);
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 8, y); ctx.stroke();
    ctx.fillText(`${Math.round(f * 100)}%`, 0, y + 4);
  }
  if (samples.length < 2) {
    ctx.fillText("collecting samples…", pad + 8, pad);
    return;
  }
  const t0 = samples[0].t, t1 = samples[samples.length - 1].t || t0 + 1;
  const x = (t) => pad + ((t - t0) / Math.max(1e-9, t1 - t0)) * (w - pad - 8);
  const line = (color, f) => {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    samples.forEach((p, i) => {
      const v = f(p);
      const y = hgt - pad - Math.min(1, v) * (hgt - 2 * pad);
      if (i === 0) ctx.moveTo(x(p.t), y); else ctx.lineTo(x(p.t), y);
    });
    ctx.stroke(); ctx.lineWidth = 1;
  };
  line("#2f6fb3", (p) => (p.cpusTotal > 0 ? p.cpusUsed / p.cpusTotal : 0));
  line("#2e8540", (p) => (p.memTotal > 0 ? p.memUsed / p.memTotal : 0));
}

// A paginated, filterable table backed by one /api/v1 list endpoint.
function listPage({ title, base, endpoint, columns, filters = [], fixed = [], rowAttrs }) {
  const p = params();
  let offset = Number(p.get("offset") || 0);
  const q = h("input", { type: "search", placeholder: "filter…", value: p.get("q") || "", id: "filter" });
  const selects = filters.map((f) => {
    const s = h("select", { id: `filter-${f.name}` }, f.options.map(([v, l]) => h("option", { value: v }, l)));
    s.value = p.get(f.name) || "";
    return [f.name, s];
  });
  const info = h("span", { class: "pager" });
  const prev = h("button", { onclick: () => { offset = Math.max(0, offset - PAGE); load(); } }, "‹ prev");
  const next = h("button", { onclick: () => { offset += PAGE; load(); } }, "next ›");
  const body = h("tbody");
  const table = h("table", { id: `${base.slice(2)}-table` },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c.title)))), body);
  let timer = null;
  q.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { offset = 0; load(); }, 200); });
  for (const [, s] of selects) s.addEventListener("change", () => { offset = 0; load(); });
  view.replaceChildren(h("h1", {}, title), h("div", { class: "toolbar" }, q, selects.map(([, s]) => s), info, prev, next), table);
  let inflight = false;
  async function load() {
    if (inflight) return;
    inflight = true;
    const u = new URLSearchParams(fixed);
    if (q.value.trim()) u.set("q", q.value.trim());
    for (const [name, s] of selects) if (s.value) u.set(name, s.value);
    if (offset) u.set("offset", String(offset));
    setParams(base, u);
    u.set("limit", String(PAGE));
    try {
      const page = await getJSON(`${endpoint}?${u}`);
      if (page.total > 0 && offset >= page.total) { offset = Math.max(0, Math.floor((page.total - 1) / PAGE) * PAGE); inflight = false; return load(); }
      body.replaceChildren(...page.items.map((item) =>
        h("tr", rowAttrs ? rowAttrs(item) : {}, columns.map((c) => h("td", { class: c.cls }, c.cell(item))))));
      info.textContent = page.total === 0 ? "nothing matches" : `${offset + 1}–${offset + page.items.length} of ${page.total}`;
      prev.disabled = offset === 0;
      next.disabled = offset + PAGE >= page.total;
    } catch (e) {
      info.replaceChildren(h("span", { class: "err" }, e.message));
    } finally {
      inflight = false;
    }
  }
  refreshCurrent = load;
  load();
}

function agentsPage() {
  listPage({
    title: "Agents", base: "#/agents", endpoint: "/api/v1/agents",
    columns: [
      { title: "id", cell: (a) => h("a", { href: `#/tasks?agent_id=${encodeURIComponent(a.id)}` }, a.id) },
      { title: "hostname", cell: (a) => a.hostname },
      { title: "address", cell: (a) => a.address },
      { title: "connected", cell: (a) => (a.connected ? "yes" : "no") },
      { title: "takes tasks", cell: (a) => (a.unavailable ? h("span", { title: a.unavailable }, `no: ${a.unavailable}`) : "yes") },
      { title: "cpus", cell: (a) => [bar(sum(a.used, "cpus"), sum(a.total, "cpus")), `${fmt(sum(a.used, "cpus"))} / ${fmt(sum(a.total, "cpus"))}`] },
      { title: "mem", cell: (a) => [bar(sum(a.used, "mem"), sum(a.total, "mem")), `${fmt(sum(a.used, "mem"), 0)} / ${fmt(sum(a.total, "mem"), 0)}`] },
      { title: "offered", cell: (a) => a.offered.text || "–" },
      { title: "tasks", cell: (a) => a.tasks },
      { title: "attributes", cell: (a) => Object.entries(a.attributes || {}).map(([k, v]) => `${k}:${typeof v === "object" ? JSON.stringify(v) : v}`).join(";") },
      { title: "registered", cell: (a) => ago(a.registered_at) },
    ],
    rowAttrs: (a) => ({ "data-agent-id": a.id }),
  });
}

function sum(resources, name) {
  let total = 0;
  for (const r of resources.list || []) if (r.name === name && typeof r.scalar === "number") total += r.scalar;
  return total;
}

function frameworksPage() {
  listPage({
    title: "Frameworks", base: "#/frameworks", endpoint: "/api/v1/frameworks",
    columns: [
      { title: "id", cell: (f) => h("a", { href: `#/tasks?framework_id=${encodeURIComponent(f.id)}` }, f.id) },
      { title: "name", cell: (f) => f.name },
      { title: "roles", cell: (f) => f.roles.join(", ") },
      { title: "connected", cell: (f) => (f.connected ? "yes" : "no") },
      { title: "shares", cell: (f) => Object.entries(f.shares).map(([r, s]) => `${r}: ${s === null ? "–" : fmt(s, 3)}`).join(", ") },
      { title: "used", cell: (f) => f.used.text || "–" },
      { title: "offers", cell: (f) => f.offers },
      { title: "tasks", cell: (f) => f.tasks },
      { title: "by state", cell: (f) => Object.entries(f.tasks_by_state).map(([k, v]) => `${k.replace(/^TASK_/, "").toLowerCase()} ${v}`).join(", ") },
      { title: "registered", cell: (f) => ago(f.registered_at) },
    ],
    rowAttrs: (f) => ({ "data-framework-id": f.id }),
  });
}

const STATES = ["STAGING", "STARTING", "RUNNING", "KILLING", "FINISHED", "FAILED", "KILLED", "LOST", "ERROR", "DROPPED"];

function tasksPage() {
  const p = params();
  const fixed = ["framework_id", "agent_id"].filter((k) => p.get(k)).map((k) => [k, p.get(k)]);
  listPage({
    title: fixed.length ? `Tasks (${fixed.map(([k, v]) => `${k.replace("_id", "")} ${v}`).join(", ")})` : "Tasks",
    base: "#/tasks", endpoint: "/api/v1/tasks", fixed,
    filters: [{ name: "state", options: [["", "all states"], ["active", "active"], ["terminal", "terminal"], ...STATES.map((s) => [s.toLowerCase(), s.toLowerCase()])] }],
    columns: [
      { title: "id", cell: (t) => h("a", { href: taskHref(t), class: "task-link" }, t.id) },
      { title: "name", cell: (t) => t.name },
      { title: "state", cell: (t) => stateCell(t.state), cls: "state-cell" },
      { title: "framework", cell: (t) => t.framework_id },
      { title: "agent", cell: (t) => t.agent_hostname ? `${t.agent_hostname} (${t.agent_address})` : t.agent_id },
      { title: "resources", cell: (t) => t.resources.text },
      { title: "finished", cell: (t) => (t.finished_at ? ago(t.finished_at) : "") },
    ],
    rowAttrs: (t) => ({ "data-task-id": t.id, "data-state": t.state }),
  });
}

function taskPage(frameworkId, taskId) {
  const details = h("dl", { id: "task-details" });
  const log = h("pre", { class: "log", id: "log" }, "");
  const status = h("div", { class: "muted", id: "log-status" });
  let file = "stdout";
  const tabs = h("div", { class: "tabs toolbar" },
    ["stdout", "stderr"].map((f) => h("button", { "data-file": f, class: f === file ? "active" : "", onclick: () => { file = f; switchFile(); } }, f)));
  view.replaceChildren(h("h1", {}, `Task ${taskId}`), details, h("h2", {}, "Sandbox"), tabs, log, status);

  let task = null;
  let offset = null; // next byte to read of `file`
  let reading = false;
  let stopped = false;

  async function loadTask() {
    const u = new URLSearchParams({ framework_id: frameworkId, q: taskId, limit: "100" });
    const page = await getJSON(`/api/v1/tasks?${u}`);
    task = page.items.find((t) => t.id === taskId) || task;
    if (!task) { details.replaceChildren(h("dd", { class: "err" }, "no such task (it may have aged out of the completed list)")); return; }
    const row = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
    details.replaceChildren(
      ...row("state", stateCell(task.state)),
      ...row("name", task.name),
      ...row("framework", task.framework_id),
      ...row("executor", task.executor_id),
      ...row("agent", `${task.agent_hostname || task.agent_id} ${task.agent_address ? "(" + task.agent_address + ")" : ""}`),
      ...row("resources", task.resources.text),
      ...row("usage", usage),
      ...(task.finished_at ? row("finished", ago(task.finished_at)) : []),
    );
    loadUsage();
  }

  // What the task's container uses, next to its limits: read from its
  // agent's /monitor/statistics (agents with --isolation cgroups).
  const usage = h("span", { id: "task-usage", class: "muted" }, "…");
  async function loadUsage() {
    if (!task.agent_address || isTerminal(task.state)) { usage.textContent = "not running"; return; }
    try {
      const entries = await getJSON(`http://${task.agent_address}/monitor/statistics`);
      const e = entries.find((x) => x.framework_id === task.framework_id && (x.tasks || []).includes(task.id));
      if (!e) { usage.textContent = "not measured (the agent does not isolate with cgroups)"; return; }
      const s = e.statistics;
      const mib = (b) => `${(b / 1048576).toFixed(1)} MiB`;
      usage.textContent = `cpu ${(s.cpus_user_time_secs + s.cpus_system_time_secs).toFixed(2)} s (limit ${s.cpus_limit} cpus, throttled in ${s.cpus_nr_throttled} of ${s.cpus_nr_periods} periods); ` +
        `memory ${mib(s.mem_total_bytes)}, peak ${mib(s.mem_max_bytes)} of ${mib(s.mem_limit_bytes)}` + (s.mem_oom_kills ? `, ${s.mem_oom_kills} out-of-memory kills` : "") +
        `; processes ${s.processes} of ${s.processes_limit}` + (e.tasks.length > 1 ? ` (container shared by ${e.tasks.length} tasks)` : "");
    } catch (err) {
      usage.textContent = `cannot read ${task.agent_address}/monitor/statistics: ${err.message}`;
    }
  }

  function switchFile() {
    for (const b of tabs.querySelectorAll("button")) b.classList.toggle("active", b.dataset.file === file);
    offset = null;
    log.textContent = "";
    readLog();
  }

  async function readLog() {
    if (reading || stopped || !task) return;
    if (!task.agent_address) { status.textContent = "the agent of this task is gone; its sandbox cannot be read"; return; }
    reading = true;
    const base = `http://${task.agent_address}/files/${encodeURIComponent(task.framework_id)}/${encodeURIComponent(task.executor_id)}/${file}`;
    const want = file;
    try {
      if (offset === null) {
        const probe = await getJSON(`${base}?length=0`);
        offset = Math.max(0, probe.size - LOG_TAIL);
      }
      for (;;) {
        const chunk = await getJSON(`${base}?offset=${offset}&length=${LOG_TAIL}`);
        if (want !== file) return;
        if (chunk.length > 0) {
          const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          log.append(chunk.data);
          if (atBottom) log.scrollTop = log.scrollHeight;
        }
        offset = chunk.offset + chunk.length;
        status.textContent = `${file}: ${chunk.size} bytes, run ${chunk.run_id}; ${isTerminal(task.state) ? "task ended" : "following"}`;
        if (chunk.eof) break;
      }
    } catch (e) {
      status.textContent = `cannot read ${file} from ${task.agent_address}: ${e.message}`;
    } finally {
      reading = false;
    }
  }

  const poll = setInterval(readLog, LOG_POLL_MS);
  stopCurrent = () => { stopped = true; clearInterval(poll); };
  refreshCurrent = async () => { try { await loadTask(); } catch (e) { status.textContent = e.message; } };
  refreshCurrent().then(readLog);
}

function isTerminal(state) {
  return ["TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_LOST", "TASK_ERROR", "TASK_DROPPED"].includes(state);
}

// --- routing ---

function route() {
  if (stopCurrent) stopCurrent();
  stopCurrent = null;
  refreshCurrent = null;
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/";
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const nav = parts[0] === "task" ? "tasks" : parts[0] || "overview";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.nav === nav);
  switch (parts[0]) {
    case undefined: return overview();
    case "agents": return agentsPage();
    case "frameworks": return frameworksPage();
    case "tasks": return tasksPage();
    case "task": return taskPage(parts[1], parts.slice(2).join("/"));
    default: view.replaceChildren(h("p", {}, "no such page"));
  }
}

window.addEventListener("hashchange", route);
connectEvents();
route();
