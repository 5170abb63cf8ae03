#!/usr/bin/env python3
"""A pymesos 0.3.15 framework that asks Agora for what it does not carry
out, as a Mesos user would, and reports what it hears back. Driven by
examples/tests/mesos_refusals.rs; prints one JSON object per line and
exits 0 when every refusal came as expected (the test checks their
states and messages).

Usage: pymesos_refusals.py MASTER

In turn, each on an offer of its own:
  1. a LAUNCH of three tasks: one in a Docker container (alpine:3.19,
     with a host volume at /data), one with a COMMAND health check that
     always fails, one plain; the first two must come back TASK_ERROR,
     the third TASK_FINISHED;
  2. an ACCEPT with a RESERVE operation beside a LAUNCH: the call is
     refused (pymesos raises the 400), the task comes back TASK_ERROR,
     and a later offer of the agent holds the refused offer's resources;
  3. a LAUNCH of a task with a key TaskInfo does not have ("contaner"):
     the same;
  4. a task whose resources' allocation_info names a role its offer was
     not allocated to (TASK_ERROR), a LAUNCH_GROUP whose DEFAULT executor
     has a name (both tasks TASK_ERROR) and one Agora runs (both
     TASK_FINISHED).
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


def run(master):
    framework = Framework()
    info = dict(user="", name="pymesos refusals", failover_timeout=0)
    driver = MesosSchedulerDriver(framework, info, master, use_addict=False,
                                  implicit_acknowledgements=False)
    driver.start()
    expect(framework, "SUBSCRIBED", lambda k, v: k == "registered")

    # 1. Fields Agora does not carry out refuse their task only.
    def launch_three(driver, offer):
        container = dict(
            type="DOCKER",
            # An image is carried out; a Docker daemon option is not.
            docker=dict(image="alpine:3.19",
                        parameters=[dict(key="cap-add", value="ALL")]),
            volumes=[dict(container_path="/data", host_path="/tmp", mode="RW")],
        )
        health = dict(type="COMMAND", command=dict(value="false"),
                      interval_seconds=1, consecutive_failures=1)
        driver.launchTasks(offer["id"], [
            task("in-docker", offer, "grep -q Alpine /etc/os-release", container=container),
            task("health-checked", offer, "sleep 2", health_check=health),
            task("plain", offer, "true"),
        ], dict(refuse_seconds=0.1))
    framework.steps.put(launch_three)
    for task_id in ["in-docker", "health-checked", "plain"]:
        while True:
            status = expect(framework, task_id + "'s update", update_of(task_id))
            if status["state"] not in ("TASK_STAGING", "TASK_STARTING", "TASK_RUNNING"):
                break

    # 2. An operation Agora does not carry out refuses the whole ACCEPT.
    refused = {}

    def reserve_and_launch(driver, offer):
        refused.update(offer)
        reserve = dict(type="RESERVE", reserve=dict(resources=[dict(
            name="cpus", type="SCALAR", scalar=dict(value=0.1),
            reservations=[dict(type="DYNAMIC", role="web", principal="p")],
        )]))
        launch = dict(type="LAUNCH", launch=dict(task_infos=[task("beside-reserve", offer)]))
        driver.acceptOffers([offer["id"]], [reserve, launch], dict(refuse_seconds=60))
    framework.steps.put(reserve_and_launch)
    expect(framework, "the ACCEPT with RESERVE refused", lambda k, v: k == "call_refused")
    expect(framework, "beside-reserve's update", update_of("beside-reserve"))
    expect(framework, "the RESERVE offer's resources offered again",
           offer_back(refused, "RESERVE"))
    say("offer_back", after="RESERVE")

    # 3. A key TaskInfo does not have: the same.
    refused.clear()

    def unknown_key(driver, offer):
        refused.update(offer)
        driver.launchTasks(offer["id"], [
            task("misspelt", offer, contaner=dict(type="DOCKER")),
        ], dict(refuse_seconds=60))
    framework.steps.put(unknown_key)
    expect(framework, "the ACCEPT with an unknown key refused", lambda k, v: k == "call_refused")
    expect(framework, "misspelt's update", update_of("misspelt"))
    expect(framework, "the misspelt offer's resources offered again",
           offer_back(refused, "unknown key"))
    say("offer_back", after="unknown key")

    # 4. A task whose allocation_info names a role its offer was not
    # allocated to, and a LAUNCH_GROUP whose DEFAULT executor sets a field
    # Agora has no place for (its name), beside a DEFAULT group Agora runs
    # (the executor's resources charged with the first task).
    def roles_and_groups(driver, offer):
        wrong_role = task("other-role", offer)
        for r in wrong_role["resources"]:
            r["allocation_info"] = dict(role="not-mine")

        def group(name, executor_extra, task_ids):
            executor = dict(type="DEFAULT", executor_id=dict(value=name),
                            resources=resources(0.1, 32))
            executor.update(executor_extra)
            return dict(type="LAUNCH_GROUP", launch_group=dict(
                executor=executor,
                task_group=dict(tasks=[task(t, offer) for t in task_ids])))
        driver.acceptOffers([offer["id"]], [
            dict(type="LAUNCH", launch=dict(task_infos=[wrong_role])),
            group("named", dict(name="my executor"), ["named-1", "named-2"]),
            group("plain-group", dict(shutdown_grace_period=dict(nanoseconds=2000000000)),
                  ["group-1", "group-2"]),
        ], dict(refuse_seconds=0.1))
    framework.steps.put(roles_and_groups)
    waiting = {"other-role", "named-1", "named-2", "group-1", "group-2"}

    def ends_one(kind, value):
        if kind != "update" or value["task_id"]["value"] not in waiting:
            return False
        return value["state"] not in ("TASK_STAGING", "TASK_STARTING", "TASK_RUNNING")
    while waiting:
        status = expect(framework, "the end of " + ", ".join(sorted(waiting)), ends_one)
        waiting.discard(status["task_id"]["value"])

    driver.stop()
    say("done")


def main():
    run(sys.argv[1])


if __name__ == "__main__":
    main()
