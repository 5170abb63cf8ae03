#!/usr/bin/env python3
"""A framework on pymesos 0.3.15, written the way pymesos users write
them, that exercises Agora's Mesos v1 scheduler API. Driven by
examples/tests/mesos_clients.rs; prints one JSON object per line and
exits 0 when its scenario played out as a Mesos master would play it.

Usage: pymesos_framework.py MASTER SCENARIO [FRAMEWORK_ID]

Scenarios:
  job          five command tasks to TASK_FINISHED, a command task that
               runs the script its CommandInfo.uris fetched into its
               sandbox (as Toil's tasks do), explicit and implicit
               reconciliation, kill, teardown
  job-pa       the same as a PARTITION_AWARE framework (unknown tasks
               reconcile as TASK_UNKNOWN instead of TASK_LOST)
  failover-1   launch a long task, print the framework id, die without
               tearing down
  failover-2   re-subscribe with FRAMEWORK_ID, find the task RUNNING by
               reconciliation, kill it, tear down
  restart      launch a long task, print "ready"; after the master
               restarts, re-subscribe (pymesos does it by itself), find
               the task by reconciliation, kill it, tear down
  takeover     FRAMEWORK_ID PRINCIPAL SECRET: subscribe naming another
               principal's framework, authenticated as PRINCIPAL; the
               master must refuse it (an ERROR event): print "refused"
               with the message, or fail if it subscribes
"""

import json
import logging
import os
import queue
import sys
import tempfile
import threading
import time

from pymesos import MesosSchedulerDriver, Scheduler

TIMEOUT = 60


_SAY = threading.Lock()


def say(event, **fields):
    # One write per line under a lock: print() writes the text and the
    # newline separately, so lines from two threads could interleave.
    line = json.dumps(dict(event=event, **fields)) + "\n"
    with _SAY:
        sys.stdout.write(line)
        sys.stdout.flush()


def fail(message):
    say("failed", message=message)
    sys.exit(1)


def resources(cpus, mem):
    return [
        dict(name="cpus", type="SCALAR", scalar=dict(value=cpus)),
        dict(name="mem", type="SCALAR", scalar=dict(value=mem)),
    ]


class Framework(Scheduler):
    """Launches queued tasks on offers; hands every callback to the
    scenario through a queue."""

    def __init__(self):
        self.events = queue.Queue()
        self.backlog = []
        self.lock = threading.Lock()
        self.to_launch = []

    def launch(self, task_id, command, uris=()):
        with self.lock:
            self.to_launch.append((task_id, command, list(uris)))

    def registered(self, driver, framework_id, master_info):
        say("registered", framework_id=framework_id["value"])
        self.events.put(("registered", framework_id["value"]))

    def reregistered(self, driver, master_info):
        say("reregistered", framework_id=driver.framework_id)
        self.events.put(("reregistered", None))

    def resourceOffers(self, driver, offers):
        for offer in offers:
            cpus = sum(r["scalar"]["value"] for r in offer["resources"] if r["name"] == "cpus")
            mem = sum(r["scalar"]["value"] for r in offer["resources"] if r["name"] == "mem")
            tasks = []
            with self.lock:
                while self.to_launch and cpus >= 0.1 and mem >= 32:
                    task_id, command, uris = self.to_launch.pop(0)
                    command = dict(value=command)
                    if uris:
                        command["uris"] = uris
                    tasks.append(dict(
                        task_id=dict(value=task_id),
                        agent_id=offer["agent_id"],
                        name=task_id,
                        resources=resources(0.1, 32),
                        command=command,
                    ))
                    cpus -= 0.1
                    mem -= 32
            if tasks:
                driver.launchTasks(offer["id"], tasks, dict(refuse_seconds=1))
            else:
                driver.declineOffer(offer["id"], dict(refuse_seconds=1))

    def statusUpdate(self, driver, update):
        say("update", task_id=update["task_id"]["value"], state=update["state"],
            reason=update.get("reason"), source=update.get("source"),
            reliable="uuid" in update)
        if "uuid" in update:
            # Reliable updates carry the agent they came from.
            assert "agent_id" in update, update
            driver.acknowledgeStatusUpdate(update)
        self.events.put(("update", update))

    def error(self, driver, message):
        say("error", message=message)
        self.events.put(("error", message))


def expect(framework, what, match):
    """Takes the first event, seen or still to come, that `match`
    accepts; fails after TIMEOUT."""
    for i, (kind, value) in enumerate(framework.backlog):
        if match(kind, value):
            del framework.backlog[i]
            return value
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        try:
            kind, value = framework.events.get(timeout=0.5)
        except queue.Empty:
            continue
        if kind == "error":
            fail("ERROR event while waiting for %s: %s" % (what, value))
        if match(kind, value):
            return value
        framework.backlog.append((kind, value))
    fail("timed out waiting for " + what)


def update_of(task_id, states):
    def match(kind, value):
        return (kind == "update" and value["task_id"]["value"] == task_id
                and value["state"] in states)
    return match


def start(master, framework_id=None, capabilities=(), framework=None,
          principal=None, secret=None):
    info = dict(user="", name="pymesos test framework", failover_timeout=300,
                capabilities=[dict(type=c) for c in capabilities])
    if framework_id:
        info["id"] = dict(value=framework_id)
    if principal:
        info["principal"] = principal
    framework = framework or Framework()
    driver = MesosSchedulerDriver(framework, info, master, use_addict=False,
                                  implicit_acknowledgements=False,
                                  principal=principal, secret=secret)
    driver.start()
    return framework, driver


def run_job(master, capabilities):
    framework, driver = start(master, capabilities=capabilities)
    expect(framework, "SUBSCRIBED", lambda k, v: k == "registered")
    ids = ["job-%d" % i for i in range(5)]
    for task_id in ids:
        framework.launch(task_id, "echo hello from " + task_id)
    for task_id in ids:
        expect(framework, task_id + " finished", update_of(task_id, ["TASK_FINISHED"]))

    # A command task with a URI: the agent fetches the script into the
    # task's sandbox (executable, as asked) before the command runs it.
    script = os.path.join(tempfile.mkdtemp(prefix="pymesos-uris-"), "fetch-me.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho fetched > fetched.txt\n")
    os.chmod(script, 0o644)
    framework.launch("fetched", "./fetch-me.sh && grep -q fetched fetched.txt",
                     uris=[dict(value=script, executable=True)])
    status = expect(framework, "fetched finished",
                    update_of("fetched", ["TASK_FINISHED", "TASK_FAILED", "TASK_ERROR"]))
    if status["state"] != "TASK_FINISHED":
        fail("the task with a URI ended %s: %s" % (status["state"], status.get("message")))

    # Explicit reconciliation: a task the master never saw.
    driver.reconcileTasks([dict(task_id=dict(value="no-such-task"))])
    unknown = "TASK_UNKNOWN" if "PARTITION_AWARE" in capabilities else "TASK_LOST"
    status = expect(framework, "reconciliation of an unknown task",
                    update_of("no-such-task", [unknown, "TASK_LOST", "TASK_UNKNOWN"]))
    if status["state"] != unknown:
        fail("unknown task reconciled as %s, expected %s" % (status["state"], unknown))
    if "uuid" in status:
        fail("a reconciliation answer carries a uuid")

    # A long task: implicit reconciliation finds it, then kill.
    framework.launch("long", "sleep 300")
    expect(framework, "long running", update_of("long", ["TASK_RUNNING"]))
    driver.reconcileTasks([])
    status = expect(framework, "implicit reconciliation",
                    lambda k, v: k == "update" and v["task_id"]["value"] == "long"
                    and v.get("reason") == "REASON_RECONCILIATION")
    if status["state"] != "TASK_RUNNING":
        fail("implicit reconciliation says " + status["state"])
    driver.killTask(dict(value="long"))
    expect(framework, "long killed", update_of("long", ["TASK_KILLED"]))
    driver.stop()
    driver.join()
    say("done")


def failover_first(master):
    framework, driver = start(master)
    framework_id = expect(framework, "SUBSCRIBED", lambda k, v: k == "registered")
    framework.launch("survivor", "sleep 300")
    expect(framework, "survivor running", update_of("survivor", ["TASK_RUNNING"]))
    say("ready", framework_id=framework_id)
    # Die as a crashed scheduler does: no TEARDOWN.
    os._exit(0)


def failover_second(master, framework_id):
    framework, driver = start(master, framework_id=framework_id)
    expect(framework, "re-subscription",
           lambda k, v: k in ("registered", "reregistered"))
    if driver.framework_id != framework_id:
        fail("the master changed the framework id to %s" % driver.framework_id)
    driver.reconcileTasks([dict(task_id=dict(value="survivor"))])
    expect(framework, "survivor reconciled", update_of("survivor", ["TASK_RUNNING"]))
    driver.killTask(dict(value="survivor"))
    expect(framework, "survivor killed", update_of("survivor", ["TASK_KILLED"]))
    driver.stop()
    driver.join()
    say("done")


def restart(master):
    framework, driver = start(master)
    framework_id = expect(framework, "SUBSCRIBED", lambda k, v: k == "registered")
    framework.launch("steady", "sleep 300")
    expect(framework, "steady running", update_of("steady", ["TASK_RUNNING"]))
    say("ready", framework_id=framework_id)
    expect(framework, "re-subscription after the master restarted",
           lambda k, v: k == "reregistered")
    if driver.framework_id != framework_id:
        fail("the framework id changed across the master restart")
    # The restarted master learns the task from the agent's
    # re-registration: ask until it answers RUNNING.
    deadline = time.time() + TIMEOUT
    while True:
        driver.reconcileTasks([dict(task_id=dict(value="steady"))])
        found = None
        wait_until = time.time() + 2
        while found is None and time.time() < wait_until:
            try:
                kind, value = framework.events.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "update" and value["task_id"]["value"] == "steady" \
                    and value["state"] == "TASK_RUNNING":
                found = value
        if found:
            break
        if time.time() > deadline:
            fail("the restarted master never reported steady RUNNING")
    driver.killTask(dict(value="steady"))
    expect(framework, "steady killed", update_of("steady", ["TASK_KILLED"]))
    driver.stop()
    driver.join()
    say("done")


def takeover(master, framework_id, principal, secret):
    framework, driver = start(master, framework_id=framework_id,
                              principal=principal, secret=secret)
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        try:
            kind, value = framework.events.get(timeout=0.5)
        except queue.Empty:
            continue
        if kind == "error":
            say("refused", message=value)
            driver.stop(failover=True)
            os._exit(0)
        if kind in ("registered", "reregistered"):
            fail("subscribed as another principal's framework")
    fail("timed out waiting for the refusal")


def main():
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    master, scenario = sys.argv[1], sys.argv[2]
    if scenario == "job":
        run_job(master, ())
    elif scenario == "job-pa":
        run_job(master, ("PARTITION_AWARE",))
    elif scenario == "failover-1":
        failover_first(master)
    elif scenario == "failover-2":
        failover_second(master, sys.argv[3])
    elif scenario == "restart":
        restart(master)
    elif scenario == "takeover":
        takeover(master, sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        fail("unknown scenario " + scenario)


if __name__ == "__main__":
    main()
