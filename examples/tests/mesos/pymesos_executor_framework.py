#!/usr/bin/env python3
"""A framework on pymesos 0.3.15 with a custom executor, written the way
pymesos users write them, that exercises Agora's Mesos v1 executor API
on the agent. Driven by examples/tests/mesos_clients.rs; prints one JSON
object per line and exits 0 when everything played out as on Mesos.

Usage: pymesos_executor_framework.py MASTER

The executor (pymesos_executor.py, beside this file) is fetched into the
sandbox through CommandInfo.uris from its path. Three tasks finish, a
long one runs; a framework message goes to the executor and its answer
comes back; the long task is killed; a task group of two tasks goes to
another executor in one LAUNCH_GROUP (ACCEPT with a LAUNCH_GROUP
operation), which finishes both and reports its ExecutorInfo's data,
labels and shutdown grace period; a task whose executor cannot be
fetched fails; the framework tears down.
"""

import json
import os
import sys
import time

from pymesos import decode_data, encode_data

from pymesos_framework import Framework, expect, fail, resources, say, start, update_of

HERE = os.path.dirname(os.path.abspath(__file__))


def executor(executor_id, script, **fields):
    return dict(
        executor_id=dict(value=executor_id),
        name="pymesos executor",
        command=dict(
            value="%s pymesos_executor.py" % sys.executable,
            uris=[dict(value=script, executable=True)],
        ),
        resources=resources(0.1, 32),
        **fields
    )


class ExecutorFramework(Framework):
    """Launches tasks of custom executors; hands framework messages to
    the scenario too."""

    def __init__(self):
        super().__init__()
        self.groups = []

    def launch_task(self, task_id, executor_info, what):
        with self.lock:
            self.to_launch.append((task_id, executor_info, what))

    def launch_group(self, task_ids, executor_info, what):
        with self.lock:
            self.groups.append((task_ids, executor_info, what))

    def resourceOffers(self, driver, offers):
        for offer in offers:
            with self.lock:
                group = self.groups.pop(0) if self.groups else None
            if group is not None:
                task_ids, executor_info, what = group
                tasks = [dict(
                    task_id=dict(value=task_id),
                    agent_id=offer["agent_id"],
                    name=task_id,
                    resources=resources(0.1, 32),
                    data=encode_data(what.encode()),
                ) for task_id in task_ids]
                operation = dict(type="LAUNCH_GROUP", launch_group=dict(
                    executor=executor_info, task_group=dict(tasks=tasks)))
                driver.acceptOffers([offer["id"]], [operation], dict(refuse_seconds=1))
                continue
            tasks = []
            with self.lock:
                while self.to_launch:
                    task_id, executor_info, what = self.to_launch.pop(0)
                    tasks.append(dict(
                        task_id=dict(value=task_id),
                        agent_id=offer["agent_id"],
                        name=task_id,
                        resources=resources(0.1, 32),
                        executor=executor_info,
                        data=encode_data(what.encode()),
                    ))
            if tasks:
                driver.launchTasks(offer["id"], tasks, dict(refuse_seconds=1))
            else:
                driver.declineOffer(offer["id"], dict(refuse_seconds=1))

    def frameworkMessage(self, driver, executor_id, agent_id, message):
        text = decode_data(message).decode()
        say("message", executor_id=executor_id["value"], agent_id=agent_id["value"], data=text)
        self.events.put(("message", text))


def main():
    master = sys.argv[1]
    framework, driver = start(master, framework=ExecutorFramework())
    expect(framework, "SUBSCRIBED", lambda k, v: k == "registered")
    work = executor("py-exec", os.path.join(HERE, "pymesos_executor.py"))
    ids = ["work-%d" % i for i in range(3)]
    for task_id in ids:
        framework.launch_task(task_id, work, "finish")
    framework.launch_task("long", work, "wait")
    running = expect(framework, "long running", update_of("long", ["TASK_RUNNING"]))
    for task_id in ids:
        status = expect(framework, task_id + " finished", update_of(task_id, ["TASK_FINISHED"]))
        labels = status.get("labels", {}).get("labels", [])
        if dict(key="wallTime", value="0.2") not in labels:
            fail("the executor's labels did not arrive: %s" % json.dumps(status))

    # Scheduler -> executor -> scheduler.
    driver.sendFrameworkMessage(dict(value="py-exec"), running["agent_id"],
                                encode_data(b"ping"))
    answer = expect(framework, "the executor's answer", lambda k, v: k == "message")
    if answer != "pong: ping [long]":
        fail("unexpected answer %r" % answer)

    driver.killTask(dict(value="long"))
    expect(framework, "long killed", update_of("long", ["TASK_KILLED"]))

    # A task group on a custom executor of its own: one LAUNCH_GROUP, both
    # tasks finish; the executor got its data, labels and grace period.
    group_executor = executor(
        "py-group", os.path.join(HERE, "pymesos_executor.py"), type="CUSTOM",
        shutdown_grace_period=dict(nanoseconds=3000000000),
        data=encode_data(b"group executor data"),
        labels=dict(labels=[dict(key="team", value="blue")]))
    framework.launch_group(["grp-1", "grp-2"], group_executor, "finish")
    report = expect(framework, "the group executor's report", lambda k, v: k == "message")
    expected = ("group grp-1,grp-2; data group executor data; labels team=blue; "
                "grace 3secs")
    if report != expected:
        fail("the group executor reported %r, not %r" % (report, expected))
    for task_id in ["grp-1", "grp-2"]:
        expect(framework, task_id + " finished", update_of(task_id, ["TASK_FINISHED"]))

    # An executor whose URI cannot be fetched: its task fails, saying why.
    missing = os.path.join(HERE, "no-such-executor.py")
    framework.launch_task("unfetchable", executor("broken-exec", missing), "finish")
    status = expect(framework, "unfetchable failed",
                    update_of("unfetchable", ["TASK_FAILED", "TASK_RUNNING", "TASK_FINISHED"]))
    if status["state"] != "TASK_FAILED" or missing not in status.get("message", ""):
        fail("a failed fetch gave %s" % json.dumps(status))
    driver.stop()
    driver.join()
    say("done")


if __name__ == "__main__":
    main()
