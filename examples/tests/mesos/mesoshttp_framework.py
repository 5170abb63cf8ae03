#!/usr/bin/env python3
"""A framework on mesoshttp 0.4.2, in mesoshttp's callback style, that
runs command tasks on Agora's Mesos v1 scheduler API: three tasks to
TASK_FINISHED, a long task killed once RUNNING, explicit reconciliation
of it and of an unknown task, then TEARDOWN. Driven by
examples/tests/mesos_clients.rs; prints one JSON object per line and
exits 0 on success.

Usage: mesoshttp_framework.py MASTER_URL
"""

import json
import logging
import os
import sys
import threading
import time

from mesoshttp.client import MesosClient

TIMEOUT = 60


def say(event, **fields):
    print(json.dumps(dict(event=event, **fields)), flush=True)


class Test(object):
    def __init__(self, url):
        self.client = MesosClient(mesos_urls=[url], frameworkName="mesoshttp test framework",
                                  frameworkUser="")
        self.client.set_failover_timeout(60)
        self.driver = None
        self.lock = threading.Lock()
        self.to_launch = ["short-%d" % i for i in range(3)] + ["long"]
        self.states = {}
        self.reconciled = {}
        self.agents = {}
        self.errors = []
        self.client.on(MesosClient.SUBSCRIBED, self.subscribed)
        self.client.on(MesosClient.OFFERS, self.offers)
        self.client.on(MesosClient.UPDATE, self.update)
        self.client.on(MesosClient.ERROR, self.error)

    def subscribed(self, driver):
        self.driver = driver
        say("subscribed", framework_id=driver.frameworkId)

    def offers(self, offers):
        for offer in offers:
            body = offer.get_offer()
            tasks = []
            with self.lock:
                while self.to_launch:
                    task_id = self.to_launch.pop(0)
                    command = "sleep 300" if task_id == "long" else "echo " + task_id
                    tasks.append({
                        "name": task_id,
                        "task_id": {"value": task_id},
                        "agent_id": {"value": body["agent_id"]["value"]},
                        "resources": [
                            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.1}},
                            {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
                        ],
                        "command": {"value": command},
                    })
            if tasks:
                offer.accept(tasks)
            else:
                offer.decline(options={"filters": {"refuse_seconds": 1}})

    def update(self, update):
        status = update["status"]
        task_id = status["task_id"]["value"]
        say("update", task_id=task_id, state=status["state"], reason=status.get("reason"))
        with self.lock:
            if "agent_id" in status:
                self.agents[task_id] = status["agent_id"]["value"]
            if status.get("reason") == "REASON_RECONCILIATION":
                self.reconciled[task_id] = status["state"]
            else:
                self.states[task_id] = status["state"]

    def error(self, message):
        say("error", message=message)
        self.errors.append(message)

    def wait(self, what, cond):
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            if self.errors:
                fail("ERROR event: %s" % self.errors)
            with self.lock:
                if cond():
                    return
            time.sleep(0.1)
        fail("timed out waiting for " + what)


def fail(message):
    say("failed", message=message)
    os._exit(1)


def main():
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    test = Test(sys.argv[1])
    thread = threading.Thread(target=test.client.register, daemon=True)
    thread.start()
    test.wait("subscription", lambda: test.driver is not None)
    test.wait("the short tasks to finish", lambda: all(
        test.states.get("short-%d" % i) == "TASK_FINISHED" for i in range(3)))
    test.wait("the long task to run", lambda: test.states.get("long") == "TASK_RUNNING")
    test.driver.reconcile([
        {"task_id": {"value": "long"}},
        {"task_id": {"value": "never-launched"}},
    ])
    test.wait("reconciliation", lambda: test.reconciled.get("long") == "TASK_RUNNING"
              and test.reconciled.get("never-launched") == "TASK_LOST")
    test.driver.kill(test.agents["long"], "long")
    test.wait("the long task to be killed", lambda: test.states.get("long") == "TASK_KILLED")
    test.driver.tearDown()
    say("done")
    os._exit(0)


if __name__ == "__main__":
    main()
