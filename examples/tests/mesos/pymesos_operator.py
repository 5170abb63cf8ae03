#!/usr/bin/env python3
"""An operator watching a Mesos master with pymesos 0.3.15's
MesosOperatorMasterDriver: it subscribes to the operator API's event
stream (POST /api/v1/operator, JSON) and prints each event it is handed
as one JSON object per line, for examples/tests/mesos_operator.rs. Runs
until killed.

Usage: pymesos_operator.py MASTER
"""

import json
import logging
import sys
import threading
import time

from pymesos import MesosOperatorMasterDriver, OperatorMaster


_SAY = threading.Lock()


def say(event, **fields):
    # One write per line under a lock: print() writes the text and the
    # newline separately, so lines from two threads could interleave.
    line = json.dumps(dict(event=event, **fields)) + "\n"
    with _SAY:
        sys.stdout.write(line)
        sys.stdout.flush()


class Watcher(OperatorMaster):
    def taskAdded(self, task_info):
        say("task_added", task_id=task_info["task_id"]["value"],
            framework_id=task_info["framework_id"]["value"], state=task_info["state"])

    def taskUpdated(self, task_info):
        say("task_updated", task_id=task_info["status"]["task_id"]["value"],
            framework_id=task_info["framework_id"]["value"], state=task_info["state"])

    def frameworkAdded(self, framework_info):
        info = framework_info["framework_info"]
        say("framework_added", id=info["id"]["value"], name=info["name"])

    def frameworkUpdated(self, framework_info):
        info = framework_info["framework_info"]
        say("framework_updated", id=info["id"]["value"], name=info["name"])

    def frameworkRemoved(self, framework_info):
        say("framework_removed", id=framework_info["id"]["value"],
            name=framework_info["name"])

    def agentAdded(self, agent_info):
        info = agent_info["agent_info"]
        say("agent_added", id=info["id"]["value"], hostname=info["hostname"])

    def agentRemoved(self, agent_id):
        say("agent_removed", id=agent_id)


class Driver(MesosOperatorMasterDriver):
    def on_subscribed(self, info):
        super(Driver, self).on_subscribed(info)
        state = info["get_state"]
        say("subscribed",
            agents=len(state.get("get_agents", {}).get("agents", [])),
            frameworks=len(state.get("get_frameworks", {}).get("frameworks", [])),
            tasks=len(state.get("get_tasks", {}).get("tasks", [])))


def main():
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    driver = Driver(sys.argv[1], Watcher(), use_addict=False)
    # A plain call first (pymesos posts it to /api/v1/operator too).
    agents = driver.getAgents()["get_agents"].get("agents", [])
    say("state", agents=len(agents))
    driver.start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
