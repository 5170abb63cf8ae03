#!/usr/bin/env python3
"""A pymesos 0.3.15 framework that runs command tasks in a Docker image,
as Mesos users do (ContainerInfo type DOCKER and MESOS), and reports
what it hears back. Driven by examples/tests/containers.rs; prints one
JSON object per line and exits 0 once every task ended (the test checks
their states, messages and sandboxes).

Usage: pymesos_containers.py MASTER IMAGE MISSING_IMAGE HOST_DIR PROBE_FILE

On one offer, a LAUNCH of three tasks:
  - probe: the shell command in PROBE_FILE, in IMAGE (type DOCKER), with HOST_DIR
    read-only at /data and the sandbox's `shared` at /shared;
  - missing: `true` in MISSING_IMAGE (type MESOS, mesos.image DOCKER),
    which the registry does not have;
  - privileged-ish: IMAGE with a Docker daemon option (docker.parameters),
    which Agora refuses by name.
"""

import json
import queue
import sys
import threading
import time

from pymesos import MesosSchedulerDriver, Scheduler

TIMEOUT = 60

_SAY = threading.Lock()


def say(event, **fields):
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


def scalar(offer, name):
    return sum(r["scalar"]["value"] for r in offer["resources"] if r["name"] == name)


def task(task_id, offer, command="true", **extra):
    info = dict(
        task_id=dict(value=task_id),
        agent_id=offer["agent_id"],
        name=task_id,
        resources=resources(0.1, 32),
        command=dict(value=command),
    )
    info.update(extra)
    return info


class Framework(Scheduler):
    """Hands each offer to the next step queued, declines the rest; every
    callback goes to the script through a queue."""

    def __init__(self):
        self.events = queue.Queue()
        self.steps = queue.Queue()

    def registered(self, driver, framework_id, master_info):
        say("registered", framework_id=framework_id["value"])
        self.events.put(("registered", None))

    def resourceOffers(self, driver, offers):
        for offer in offers:
            self.events.put(("offer", offer))
            try:
                step = self.steps.get_nowait()
            except queue.Empty:
                driver.declineOffer(offer["id"], dict(refuse_seconds=0.1))
                continue
            try:
                step(driver, offer)
            except RuntimeError as e:
                # pymesos raises what the master answers other than 2xx.
                say("call_refused", message=str(e).split("\n")[0])
                self.events.put(("call_refused", str(e)))

    def statusUpdate(self, driver, update):
        say("update", task_id=update["task_id"]["value"], state=update["state"],
            reason=update.get("reason"), message=update.get("message"))
        if "uuid" in update:
            driver.acknowledgeStatusUpdate(update)
        self.events.put(("update", update))

    def error(self, driver, message):
        say("error", message=message)
        self.events.put(("error", message))


def expect(framework, what, match):
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
    fail("timed out waiting for " + what)


def update_of(task_id):
    return lambda kind, value: kind == "update" and value["task_id"]["value"] == task_id


def offer_back(refused, what):
    """A later offer of the refused offer's agent, with at least its
    resources."""
    def match(kind, value):
        return (kind == "offer" and value["id"] != refused["id"]
                and value["agent_id"] == refused["agent_id"]
                and scalar(value, "cpus") >= scalar(refused, "cpus")
                and scalar(value, "mem") >= scalar(refused, "mem"))
    return match


def run(master, image, missing, host, probe):
    framework = Framework()
    info = dict(user="", name="pymesos containers", failover_timeout=0)
    driver = MesosSchedulerDriver(framework, info, master, use_addict=False,
                                  implicit_acknowledgements=False)
    driver.start()
    expect(framework, "SUBSCRIBED", lambda k, v: k == "registered")

    def launch(driver, offer):
        in_image = dict(
            type="DOCKER",
            docker=dict(image=image, network="HOST"),
            volumes=[
                dict(container_path="/data", host_path=host, mode="RO"),
                dict(container_path="/shared", mode="RW",
                     source=dict(type="SANDBOX_PATH",
                                 sandbox_path=dict(type="SELF", path="shared"))),
            ],
        )
        not_there = dict(
            type="MESOS",
            mesos=dict(image=dict(type="DOCKER", docker=dict(name=missing))),
        )
        daemon_option = dict(
            type="DOCKER",
            docker=dict(image=image, parameters=[dict(key="cap-add", value="ALL")]),
        )
        driver.launchTasks(offer["id"], [
            task("probe", offer, probe, container=in_image),
            task("missing", offer, "true", container=not_there),
            task("privileged-ish", offer, "true", container=daemon_option),
        ], dict(refuse_seconds=0.1))
    framework.steps.put(launch)
    # Their updates come in any order.
    pending = {"probe", "missing", "privileged-ish"}
    while pending:
        status = expect(framework, "the updates of " + ", ".join(sorted(pending)),
                        lambda k, v: k == "update" and v["task_id"]["value"] in pending)
        if status["state"] not in ("TASK_STAGING", "TASK_STARTING", "TASK_RUNNING"):
            pending.discard(status["task_id"]["value"])

    driver.stop()
    say("done")


def main():
    master, image, missing, host, probe_file = sys.argv[1:6]
    with open(probe_file) as f:
        probe = f.read()
    run(master, image, missing, host, probe)


if __name__ == "__main__":
    main()
