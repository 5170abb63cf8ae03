#!/usr/bin/env python3
"""A framework on mesoshttp 0.4.2, in mesoshttp's callback style, that
runs command tasks on Agora's Mesos v1 scheduler API. Driven by
examples/tests/mesos_clients.rs; prints one JSON object per line and
exits 0 on success.

Usage: mesoshttp_framework.py MASTER_URL [SCENARIO [FRAMEWORK_ID]]

Scenarios:
  job          (the default) three tasks to TASK_FINISHED, a long task
               killed once RUNNING, explicit reconciliation of it and of
               an unknown task, then TEARDOWN (mesoshttp sends nothing for
               an implicit reconciliation: its reconcile([]) returns early)
  failover-1   launch a long task, print the framework id, die without
               tearing down
  failover-2   subscribe with FRAMEWORK_ID, find the task RUNNING by
               reconciliation, kill it, tear down
  restart      launch a long task, print "ready"; after the master
               restarts, re-subscribe (mesoshttp's register loop does it
               by itself, after its WAIT_TIME), find the task by
               reconciliation, kill it, tear down
"""

import json
import logging
import os
import sys
import threading
import time

from mesoshttp.client import MesosClient

TIMEOUT = 60


_SAY = threading.Lock()


def say(event, **fields):
    # One write per line under a lock: print() writes the text and the
    # newline separately, so lines from two threads could interleave.
    line = json.dumps(dict(event=event, **fields)) + "\n"
    with _SAY:
        sys.stdout.write(line)
        sys.stdout.flush()


class Test(object):
    def __init__(self, url, to_launch, framework_id=None):
        self.client = MesosClient(mesos_urls=[url], frameworkId=framework_id,
                                  frameworkName="mesoshttp test framework",
                                  frameworkUser="")
        self.client.set_failover_timeout(60)
        self.driver = None
        self.subscriptions = 0
        self.lock = threading.Lock()
        self.to_launch = list(to_launch)
        self.states = {}
        self.reconciled = {}
        self.agents = {}
        self.errors = []
        self.client.on(MesosClient.SUBSCRIBED, self.subscribed)
        self.client.on(MesosClient.OFFERS, self.offers)
        self.client.on(MesosClient.UPDATE, self.update)
        self.client.on(MesosClient.ERROR, self.error)

    def subscribed(self, driver):
        with self.lock:
            self.driver = driver
            self.subscriptions += 1
            again = self.subscriptions > 1
        say("reregistered" if again else "subscribed", framework_id=driver.frameworkId)

    def offers(self, offers):
        for offer in offers:
            body = offer.get_offer()
            tasks = []
            with self.lock:
                while self.to_launch:
                    task_id = self.to_launch.pop(0)
                    command = "echo " + task_id if task_id.startswith("short-") else "sleep 300"
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


def start(url, to_launch, framework_id=None):
    test = Test(url, to_launch, framework_id)
    thread = threading.Thread(target=test.client.register, daemon=True)
    thread.start()
    test.wait("subscription", lambda: test.driver is not None)
    return test


def run_job(url):
    test = start(url, ["short-%d" % i for i in range(3)] + ["long"])
    test.wait("the short tasks to finish", lambda: all(
        test.states.get("short-%d" % i) == "TASK_FINISHED" for i in range(3)))
    test.wait("the long task to run", lambda: test.states.get("long") == "TASK_RUNNING")
    test.driver.reconcile([
        {"task_id": {"value": "long"}},
        {"task_id": {"value": "never-launched"}},
    ])
    test.wait("reconciliation", lambda: test.reconciled.get("long") == "TASK_RUNNING"
              and test.reconciled.get("never-launched") == "TASK_LOST")
    kill_and_tear_down(test, "long")


def kill_and_tear_down(test, task_id):
    test.driver.kill(test.agents[task_id], task_id)
    test.wait(task_id + " to be killed", lambda: test.states.get(task_id) == "TASK_KILLED")
    test.driver.tearDown()
    say("done")
    os._exit(0)


def run_long(url, task_id):
    test = start(url, [task_id])
    test.wait(task_id + " to run", lambda: test.states.get(task_id) == "TASK_RUNNING")
    say("ready", framework_id=test.driver.frameworkId)
    return test


def reconcile_until_running(test, task_id):
    deadline = time.time() + TIMEOUT
    while True:
        with test.lock:
            test.reconciled.pop(task_id, None)
        test.driver.reconcile([{"task_id": {"value": task_id}}])
        until = time.time() + 2
        while time.time() < until:
            with test.lock:
                if test.reconciled.get(task_id) == "TASK_RUNNING":
                    return
            time.sleep(0.1)
        if time.time() > deadline:
            fail("the master never reported %s RUNNING" % task_id)


def failover_second(url, framework_id):
    test = start(url, [], framework_id)
    if test.driver.frameworkId != framework_id:
        fail("the master changed the framework id to %s" % test.driver.frameworkId)
    reconcile_until_running(test, "survivor")
    kill_and_tear_down(test, "survivor")


def restart(url):
    test = run_long(url, "steady")
    framework_id = test.driver.frameworkId
    test.wait("re-subscription after the master restarted", lambda: test.subscriptions > 1)
    if test.driver.frameworkId != framework_id:
        fail("the framework id changed across the master restart")
    reconcile_until_running(test, "steady")
    kill_and_tear_down(test, "steady")


def main():
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    url = sys.argv[1]
    scenario = sys.argv[2] if len(sys.argv) > 2 else "job"
    if scenario == "job":
        run_job(url)
    elif scenario == "failover-1":
        run_long(url, "survivor")
        # Die as a crashed scheduler does: no TEARDOWN.
        os._exit(0)
    elif scenario == "failover-2":
        failover_second(url, sys.argv[3])
    elif scenario == "restart":
        restart(url)
    else:
        fail("unknown scenario " + scenario)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        import traceback
        fail("uncaught: " + traceback.format_exc())
