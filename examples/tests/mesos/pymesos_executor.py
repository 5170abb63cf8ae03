#!/usr/bin/env python3
"""A custom executor on pymesos 0.3.15, written the way pymesos users
write them (MesosExecutorDriver and an Executor), for
pymesos_executor_framework.py. The agent fetches this file into the
executor's sandbox through CommandInfo.uris and starts it with the Mesos
environment (MESOS_AGENT_ENDPOINT, MESOS_FRAMEWORK_ID, ...); it speaks
the Mesos v1 executor API at /api/v1/executor.

A task's data says what it does: "finish" runs briefly and ends
TASK_FINISHED; "wait" runs until it is killed. A framework message
"ping" is answered with "pong: ping" (and the tasks this executor runs).
A task group (LAUNCH_GROUP) runs each of its tasks so, and is reported
to the scheduler in a framework message: its tasks, and what the
executor was given (its ExecutorInfo's data and labels, and
MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD).
"""

import logging
import os
import sys
import threading
import time

from pymesos import Executor, MesosExecutorDriver, decode_data, encode_data


class WorkExecutor(Executor):
    def __init__(self):
        self.lock = threading.Lock()
        self.running = set()

    def registered(self, driver, executor_info, framework_info, agent_info):
        logging.info("registered with agent %s as %s", agent_info["id"]["value"],
                     executor_info["executor_id"]["value"])
        self.executor_info = executor_info

    def launchTaskGroup(self, driver, tasks):
        info = self.executor_info
        data = decode_data(info["data"]).decode() if "data" in info else ""
        labels = ",".join("%s=%s" % (l["key"], l.get("value", ""))
                          for l in info.get("labels", {}).get("labels", []))
        report = "group %s; data %s; labels %s; grace %s" % (
            ",".join(t["task_id"]["value"] for t in tasks), data, labels,
            os.environ.get("MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD"))
        driver.sendFrameworkMessage(encode_data(report.encode()))
        for task in tasks:
            self.launchTask(driver, task)

    def launchTask(self, driver, task):
        task_id = task["task_id"]
        what = decode_data(task["data"]).decode() if "data" in task else "finish"

        def run():
            update(driver, task_id, "TASK_RUNNING")
            with self.lock:
                self.running.add(task_id["value"])
            if what == "finish":
                time.sleep(0.2)
                with self.lock:
                    self.running.discard(task_id["value"])
                # Labels travel to the scheduler (toil reads its wallTime so).
                update(driver, task_id, "TASK_FINISHED", message="finished by the pymesos executor",
                       labels=dict(labels=[dict(key="wallTime", value="0.2")]))

        threading.Thread(target=run, daemon=True).start()

    def killTask(self, driver, task_id):
        with self.lock:
            self.running.discard(task_id["value"])
        update(driver, task_id, "TASK_KILLED", message="killed by the pymesos executor")

    def frameworkMessage(self, driver, message):
        text = decode_data(message).decode()
        with self.lock:
            running = ",".join(sorted(self.running))
        driver.sendFrameworkMessage(encode_data(("pong: %s [%s]" % (text, running)).encode()))

    def shutdown(self, driver):
        logging.info("shutting down")

    def error(self, driver, message):
        logging.error("error from the agent: %s", message)


def update(driver, task_id, state, **fields):
    driver.sendStatusUpdate(dict(task_id=task_id, state=state, **fields))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    MesosExecutorDriver(WorkExecutor(), use_addict=False).run()
