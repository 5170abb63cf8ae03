// The web UI in real headless Chromium (Debian's /usr/bin/chromium, driven
// by playwright-core; no browser download) against a real local cluster:
// `agora-local` serves a master and two agents, `agora execute` launches a
// task, and the page — loaded once, never reloaded — must show the task
// appear and finish (live updates over /events), then show its stdout
// read from the agent's /files.
//
//   AGORA_BIN=target/debug/agora AGORA_LOCAL_BIN=target/debug/agora-local node ui.test.mjs
//
// Screenshots go to a temporary directory (printed), never into the repo.
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const AGORA = process.env.AGORA_BIN;
const AGORA_LOCAL = process.env.AGORA_LOCAL_BIN;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const TIMEOUT_MS = 30_000;
const MARKER = "hello-from-the-browser-test";

if (!AGORA || !AGORA_LOCAL) {
  console.error("set AGORA_BIN to the agora binary and AGORA_LOCAL_BIN to agora-local");
  process.exit(2);
}

const children = [];
function run(args, bin = AGORA) {
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  child.stdout.on("data", (d) => { out += d; });
  child.stderr.on("data", (d) => { out += d; });
  child.output = () => out;
  return child;
}

function waitForLine(child, re) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${re} within ${TIMEOUT_MS} ms; output:\n${child.output()}`)), TIMEOUT_MS);
    const check = () => {
      const m = re.exec(child.output());
      if (m) { clearTimeout(timer); resolve(m); }
    };
    child.stdout.on("data", check);
    child.on("exit", (code) => { clearTimeout(timer); reject(new Error(`exited with ${code}:\n${child.output()}`)); });
    check();
  });
}

function exited(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve(child.exitCode);
    child.on("exit", (code) => resolve(code));
  });
}

let browser;
const shots = mkdtempSync(join(tmpdir(), "agora-ui-"));
async function main() {
  const cluster = run(["--agents", "2"], AGORA_LOCAL);
  const [, master] = await waitForLine(cluster, /master: (\S+)/);
  console.log(`cluster up, master at ${master}`);

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage();
  page.setDefaultTimeout(TIMEOUT_MS);
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));

  // The overview: live numbers and the utilisation chart.
  await page.goto(`http://${master}/`);
  await page.waitForSelector("#live.on");
  await page.waitForFunction(() => document.querySelector("#card-agents .n")?.textContent === "2");
  await page.waitForSelector("canvas#utilisation");

  // The tasks page, loaded before the task exists.
  await page.click('header nav a[data-nav="tasks"]');
  await page.waitForSelector("#tasks-table");
  const job = run(["--master", master, "execute", "--name", "uitest", "--instances", "1",
    "--command", `echo ${MARKER}; sleep 2`]);
  const row = 'tr[data-task-id="uitest-0"]';
  await page.waitForSelector(row);
  console.log(`task appeared as ${await page.getAttribute(row, "data-state")}`);
  await page.waitForSelector(`${row}[data-state="TASK_FINISHED"]`);
  console.log("task finished");
  const code = await exited(job);
  if (code !== 0) throw new Error(`agora execute exited ${code}:\n${job.output()}`);

  // Filtering finds it; a filter matching nothing empties the table.
  await page.fill("#filter", "uitest");
  await page.waitForFunction(() => document.querySelector(".pager")?.textContent.includes("of 1"));
  await page.selectOption("#filter-state", "running");
  await page.waitForFunction(() => document.querySelector(".pager")?.textContent === "nothing matches");
  await page.selectOption("#filter-state", "finished");
  await page.waitForSelector(row);

  // Its page tails stdout from the agent.
  await page.click(`${row} a.task-link`);
  await page.waitForSelector("#task-details");
  await page.waitForFunction((m) => document.querySelector("#log")?.textContent.includes(m), MARKER);
  console.log("stdout shown");
  await page.screenshot({ path: join(shots, "task.png"), fullPage: true });

  if (errors.length) throw new Error(`errors on the page: ${errors.join("; ")}`);
  console.log(`ok (screenshots in ${shots})`);
}

let failed = false;
try {
  await main();
} catch (e) {
  failed = true;
  console.error(`FAILED: ${e.stack || e}`);
} finally {
  if (browser) await browser.close().catch(() => {});
  for (const c of children) if (c.exitCode === null) c.kill("SIGTERM");
  await Promise.all(children.map(exited));
}
process.exit(failed ? 1 : 0);
