// Command scheduler is a Mesos framework written with mesos-go's v1
// library (api/v1/lib, as Debian's golang-github-mesos-mesos-go-dev ships
// it), in the library's own idioms: an httpsched caller, the controller's
// subscribe loop with registration tokens, event rules that lift ERROR
// events, track the framework id and acknowledge status updates, and
// calls built with the calls package.
//
// It exercises Agora's Mesos v1 scheduler API for
// examples/tests/mesos_go.rs: it prints one JSON object per line on
// stdout ({"event": ...}) and exits 0 when its scenario played out as a
// Mesos master would play it, 1 (after a "failed" line) otherwise.
//
// Usage:
//
//	scheduler -url http://HOST:PORT/api/v1/scheduler [-codec protobuf|json] -scenario NAME [-framework-id ID] [-executor PATH]
//
// Scenarios:
//
//	job          five command tasks to TASK_FINISHED, explicit and implicit
//	             reconciliation, kill, suppress, teardown
//	job-pa       the same as a PARTITION_AWARE framework (an unknown task
//	             reconciles as TASK_UNKNOWN instead of TASK_LOST)
//	failover-1   launch a long task, print the framework id, die without
//	             tearing down
//	failover-2   re-subscribe with -framework-id, find the task RUNNING by
//	             reconciliation, kill it, tear down
//	restart      launch a long task, print "ready"; after the master
//	             restarts, re-subscribe (the controller does it by itself),
//	             find the task by reconciliation, kill it, tear down
//	executor     tasks of a custom executor (-executor, the mesos-go
//	             executor of tests/mesos-go/executor, fetched through
//	             CommandInfo.uris as mesos-go's example-scheduler does):
//	             three to TASK_FINISHED, a framework message answered by
//	             the executor, a long one killed, teardown
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/mesos/mesos-go/api/v1/lib/encoding"
	"github.com/mesos/mesos-go/api/v1/lib/encoding/codecs"
)

// timeout bounds every wait of a scenario.
const timeout = 60 * time.Second

type config struct {
	url         string
	codec       encoding.Codec
	scenario    string
	frameworkID string
	executor    string
}

func main() {
	log.SetOutput(os.Stderr)
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	var (
		cfg       config
		codecName = flag.String("codec", codecs.NameProtobuf, "codec of the scheduler API: protobuf (mesos-go's default) or json")
	)
	flag.StringVar(&cfg.url, "url", "http://127.0.0.1:5050/api/v1/scheduler", "Mesos scheduler API endpoint")
	flag.StringVar(&cfg.scenario, "scenario", "job", "job, job-pa, failover-1, failover-2, restart or executor")
	flag.StringVar(&cfg.frameworkID, "framework-id", "", "framework id to fail over to (failover-2)")
	flag.StringVar(&cfg.executor, "executor", "", "path of the executor binary the agent fetches (executor)")
	flag.Parse()
	switch *codecName {
	case codecs.NameProtobuf:
		cfg.codec = codecs.ByMediaType[codecs.MediaTypeProtobuf]
	case codecs.NameJSON:
		cfg.codec = codecs.ByMediaType[codecs.MediaTypeJSON]
	default:
		fail("unknown codec %q", *codecName)
	}
	if err := run(cfg); err != nil {
		fail("%v", err)
	}
	say("done", nil)
}

// say prints one event line for the test.
func say(event string, fields map[string]interface{}) {
	line := map[string]interface{}{"event": event}
	for k, v := range fields {
		line[k] = v
	}
	b, err := json.Marshal(line)
	if err != nil {
		log.Fatalf("cannot print %v: %v", line, err)
	}
	fmt.Println(string(b))
}

// fail prints a "failed" line and exits 1.
func fail(format string, args ...interface{}) {
	message := fmt.Sprintf(format, args...)
	log.Println("failed:", message)
	say("failed", map[string]interface{}{"message": message})
	os.Exit(1)
}

func run(cfg config) error {
	switch cfg.scenario {
	case "job":
		return runJob(cfg, false)
	case "job-pa":
		return runJob(cfg, true)
	case "failover-1":
		return failoverFirst(cfg)
	case "failover-2":
		if cfg.frameworkID == "" {
			return fmt.Errorf("failover-2 needs -framework-id")
		}
		return failoverSecond(cfg)
	case "restart":
		return restart(cfg)
	case "executor":
		if cfg.executor == "" {
			return fmt.Errorf("the executor scenario needs -executor")
		}
		return runExecutor(cfg)
	}
	return fmt.Errorf("unknown scenario %q", cfg.scenario)
}

// waitContext is the bound of one wait.
func waitContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), timeout)
}
