// Command operator watches a Mesos master through the v1 operator API
// with mesos-go's httpmaster sender, the way mesos-go's mwatch does: a
// GET_STATE, then a SUBSCRIBE whose events it prints as they come, one
// JSON object per line on stdout ({"event": ...}), for
// examples/tests/mesos_operator.rs. It runs until the stream ends or it
// is killed; a decoding error (a missing proto2 required field, a wrong
// Content-Type, bad framing) prints a "failed" line and exits 1.
//
// Usage:
//
//	operator -url http://HOST:PORT/api/v1 [-codec protobuf|json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/mesos/mesos-go/api/v1/lib"
	"github.com/mesos/mesos-go/api/v1/lib/encoding"
	"github.com/mesos/mesos-go/api/v1/lib/encoding/codecs"
	"github.com/mesos/mesos-go/api/v1/lib/httpcli"
	"github.com/mesos/mesos-go/api/v1/lib/httpcli/httpmaster"
	"github.com/mesos/mesos-go/api/v1/lib/master"
	"github.com/mesos/mesos-go/api/v1/lib/master/calls"
)

func main() {
	log.SetOutput(os.Stderr)
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	var (
		url       = flag.String("url", "http://127.0.0.1:5050/api/v1", "Mesos operator API endpoint")
		codecName = flag.String("codec", codecs.NameProtobuf, "protobuf (mesos-go's default) or json")
		codec     encoding.Codec
	)
	flag.Parse()
	switch *codecName {
	case codecs.NameProtobuf:
		codec = codecs.ByMediaType[codecs.MediaTypeProtobuf]
	case codecs.NameJSON:
		codec = codecs.ByMediaType[codecs.MediaTypeJSON]
	default:
		fail("unknown codec %q", *codecName)
	}
	cli := httpcli.New(
		httpcli.Endpoint(*url),
		httpcli.Codec(codec),
		httpcli.Do(httpcli.With(httpcli.Timeout(10*time.Second))),
	)
	sender := httpmaster.NewSender(cli.Send)
	ctx := context.Background()

	// A singleton response: mesos-go insists its Content-Type is exactly
	// the codec's.
	resp, err := sender.Send(ctx, calls.NonStreaming(calls.GetState()))
	if err != nil {
		fail("GET_STATE: %v", err)
	}
	var state master.Response
	if err := resp.Decode(&state); err != nil {
		fail("decoding GET_STATE: %v", err)
	}
	resp.Close()
	say("state", map[string]interface{}{
		"agents":     len(state.GetGetState().GetGetAgents().GetAgents()),
		"frameworks": len(state.GetGetState().GetGetFrameworks().GetFrameworks()),
	})

	resp, err = sender.Send(ctx, calls.NonStreaming(calls.Subscribe()))
	if err != nil {
		fail("SUBSCRIBE: %v", err)
	}
	defer resp.Close()
	for {
		var e master.Event
		if err := resp.Decode(&e); err != nil {
			if err == io.EOF {
				say("closed", nil)
				return
			}
			fail("decoding an event: %v", err)
		}
		report(&e)
	}
}

func report(e *master.Event) {
	switch e.GetType() {
	case master.Event_SUBSCRIBED:
		s := e.GetSubscribed().GetGetState()
		say("subscribed", map[string]interface{}{
			"agents":     len(s.GetGetAgents().GetAgents()),
			"frameworks": len(s.GetGetFrameworks().GetFrameworks()),
			"tasks":      len(s.GetGetTasks().GetTasks()),
		})
	case master.Event_TASK_ADDED:
		t := e.GetTaskAdded().Task
		say("task_added", map[string]interface{}{
			"task_id":      t.TaskID.Value,
			"framework_id": t.FrameworkID.Value,
			"state":        stateName(t.State),
		})
	case master.Event_TASK_UPDATED:
		u := e.GetTaskUpdated()
		say("task_updated", map[string]interface{}{
			"task_id":      u.Status.TaskID.Value,
			"framework_id": u.FrameworkID.Value,
			"state":        stateName(u.State),
		})
	case master.Event_FRAMEWORK_ADDED:
		f := e.GetFrameworkAdded().Framework.FrameworkInfo
		say("framework_added", map[string]interface{}{"id": f.GetID().GetValue(), "name": f.Name})
	case master.Event_FRAMEWORK_UPDATED:
		f := e.GetFrameworkUpdated().Framework.FrameworkInfo
		say("framework_updated", map[string]interface{}{"id": f.GetID().GetValue(), "name": f.Name})
	case master.Event_FRAMEWORK_REMOVED:
		f := e.GetFrameworkRemoved().FrameworkInfo
		say("framework_removed", map[string]interface{}{"id": f.GetID().GetValue(), "name": f.Name})
	case master.Event_AGENT_ADDED:
		a := e.GetAgentAdded().Agent
		say("agent_added", map[string]interface{}{"id": a.AgentInfo.GetID().GetValue(), "hostname": a.AgentInfo.Hostname})
	case master.Event_AGENT_REMOVED:
		say("agent_removed", map[string]interface{}{"id": e.GetAgentRemoved().AgentID.Value})
	default:
		// HEARTBEAT (9) is newer than this mesos-go's master.proto.
		log.Println("event", e.GetType())
	}
}

func stateName(s *mesos.TaskState) string {
	if s == nil {
		return ""
	}
	return s.String()
}

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

func fail(format string, args ...interface{}) {
	message := fmt.Sprintf(format, args...)
	log.Println("failed:", message)
	say("failed", map[string]interface{}{"message": message})
	os.Exit(1)
}
