package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mesos/mesos-go/api/v1/lib"
	"github.com/mesos/mesos-go/api/v1/lib/scheduler/calls"
)

func runJob(cfg config, partitionAware bool) error {
	var capabilities []mesos.FrameworkInfo_Capability_Type
	if partitionAware {
		capabilities = append(capabilities, mesos.FrameworkInfo_Capability_PARTITION_AWARE)
	}
	fw := newFramework(cfg, "", capabilities...)
	fw.start()
	fw.expect("SUBSCRIBED", isSubscribed)

	ids := []string{}
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("job-%d", i)
		ids = append(ids, id)
		fw.launch(id, "echo hello from "+id)
	}
	for _, id := range ids {
		fw.expect(id+" finished", updateOf(id, mesos.TASK_FINISHED))
	}

	// Explicit reconciliation: a task the master never saw.
	fw.reconcile(map[string]string{"no-such-task": ""})
	unknown := mesos.TASK_LOST
	if partitionAware {
		unknown = mesos.TASK_UNKNOWN
	}
	o := fw.expect("reconciliation of an unknown task",
		updateOf("no-such-task", mesos.TASK_LOST, mesos.TASK_UNKNOWN))
	if o.status.GetState() != unknown {
		return fmt.Errorf("unknown task reconciled as %s, expected %s", o.status.GetState(), unknown)
	}
	if len(o.status.GetUUID()) > 0 {
		return fmt.Errorf("a reconciliation answer carries a uuid")
	}

	// A long task: implicit reconciliation finds it, then kill.
	fw.launch("long", "sleep 300")
	fw.expect("long running", updateOf("long", mesos.TASK_RUNNING))
	fw.reconcile(nil)
	o = fw.expect("implicit reconciliation", func(o observed) bool {
		return o.kind == "update" && o.status.TaskID.Value == "long" &&
			o.status.GetReason() == mesos.REASON_RECONCILIATION
	})
	if o.status.GetState() != mesos.TASK_RUNNING {
		return fmt.Errorf("implicit reconciliation says %s", o.status.GetState())
	}
	fw.kill("long")
	fw.expect("long killed", updateOf("long", mesos.TASK_KILLED))
	fw.call("SUPPRESS", calls.Suppress())
	fw.teardown()
	return nil
}

// runLong subscribes a new framework, runs a long task to
// TASK_RUNNING and prints "ready" with the framework id.
func runLong(cfg config, task string) (*framework, string) {
	fw := newFramework(cfg, "")
	fw.start()
	id := fw.expect("SUBSCRIBED", isSubscribed).frameworkID
	fw.launch(task, "sleep 300")
	fw.expect(task+" running", updateOf(task, mesos.TASK_RUNNING))
	say("ready", map[string]interface{}{"framework_id": id})
	return fw, id
}

// killAndTeardown kills a task, waits for TASK_KILLED and tears the
// framework down.
func (fw *framework) killAndTeardown(task string) {
	fw.kill(task)
	fw.expect(task+" killed", updateOf(task, mesos.TASK_KILLED))
	fw.teardown()
}

func failoverFirst(cfg config) error {
	runLong(cfg, "survivor")
	// Die as a crashed scheduler does: no TEARDOWN.
	os.Exit(0)
	return nil
}

func failoverSecond(cfg config) error {
	fw := newFramework(cfg, cfg.frameworkID)
	fw.start()
	id := fw.expect("re-subscription", isSubscribed).frameworkID
	if id != cfg.frameworkID {
		return fmt.Errorf("the master changed the framework id to %s", id)
	}
	fw.reconcile(map[string]string{"survivor": ""})
	fw.expect("survivor reconciled", updateOf("survivor", mesos.TASK_RUNNING))
	fw.killAndTeardown("survivor")
	return nil
}

func restart(cfg config) error {
	fw, id := runLong(cfg, "steady")

	again := fw.expect("re-subscription after the master restarted", isSubscribed).frameworkID
	if again != id {
		return fmt.Errorf("the framework id changed across the master restart: %s, then %s", id, again)
	}
	// The restarted master learns the task from the agent's
	// re-registration: ask until it answers RUNNING.
	deadline := time.Now().Add(timeout)
	for {
		fw.reconcile(map[string]string{"steady": ""})
		if fw.expectWithin(2*time.Second, updateOf("steady", mesos.TASK_RUNNING)) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the restarted master never reported steady RUNNING")
		}
	}
	fw.killAndTeardown("steady")
	return nil
}

// runExecutor runs tasks of a custom executor that the agent fetches
// from cfg.executor, as mesos-go's example-scheduler serves its
// executor: CommandInfo.uris with executable set, a shell command
// starting it from the sandbox.
func runExecutor(cfg config) error {
	fw := newFramework(cfg, "")
	fw.start()
	fw.expect("SUBSCRIBED", isSubscribed)
	name := filepath.Base(cfg.executor)
	command := "./" + name
	executable := true
	executorInfo := &mesos.ExecutorInfo{
		ExecutorID: mesos.ExecutorID{Value: "go-exec"},
		Name:       &name,
		Command: &mesos.CommandInfo{
			Value: &command,
			URIs:  []mesos.CommandInfo_URI{{Value: cfg.executor, Executable: &executable}},
		},
	}
	ids := []string{"work-0", "work-1", "work-2"}
	for _, id := range ids {
		fw.launchWith(id, executorInfo, "finish")
	}
	fw.launchWith("long", executorInfo, "wait")
	running := fw.expect("long running", updateOf("long", mesos.TASK_RUNNING))
	for _, id := range ids {
		fw.expect(id+" finished", updateOf(id, mesos.TASK_FINISHED))
	}
	agent := running.status.GetAgentID().GetValue()
	fw.call("MESSAGE", calls.Message(agent, "go-exec", []byte("ping")))
	answer := fw.expect("the executor's answer", func(o observed) bool { return o.kind == "message" })
	if got := string(answer.message.Data); got != "pong: ping" {
		return fmt.Errorf("the executor answered %q", got)
	}
	if answer.message.ExecutorID.Value != "go-exec" || answer.message.AgentID.Value != agent {
		return fmt.Errorf("the answer came from %v on %v", answer.message.ExecutorID, answer.message.AgentID)
	}
	fw.killAndTeardown("long")
	return nil
}
