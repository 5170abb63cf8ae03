#!/usr/bin/env python3
"""A framework on pymesos 0.3.15 with a custom executor, written the way
pymesos users write them, that exercises Agora's Mesos v1 executor API
on the agent. Driven by examples/tests/mesos_clients.rs; prints one JSON
object per line and exits 0 when everything played out as on Mesos.

Usage: pymesos_executor_framework.py MASTER

The executor (pymesos_executor.py, beside this file) is fetched into the
sandbox through CommandInfo.uris from its path. Three tasks finish, a
long one runs; a framework message goes to the executor and its answer
comes back; the long task is killed; a task whose executor cannot be
fetched fails; the framework tears down.
"""

import json
import os
import sys
import time

from pymesos import decode_data, encode_data

from pymesos_framework import Framework, expect, fail, resources, say, start, update_of

HERE = os.path.dirname(os.path.abspath(__file__))


def executor(executor_id, script):
    return dict(
        executor_id=dict(value=executor_id),
        name="pymesos executor",
        command=dict(
            value="%s pymesos_executor.py" % sys.executable,
            uris=[dict(value=script, executable=True)],
        ),
        resources=resources(0.1, 32),
    )


class ExecutorFramework(Framework):
    """Launches tasks of custom executors; hands framework messages to
    the scenario too."""

    def launch_task(self, task_id, executor_info, what):
        with self.lock:
            self.to_launch.append((task_id, executor_info, what))

    def resourceOffers(self, driver, offers):
        for offer in offers:
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
