// Command executor is a Mesos custom executor written with mesos-go's v1
// library (api/v1/lib, as Debian's golang-github-mesos-mesos-go-dev ships
// it), in the idioms of mesos-go's example-executor: configuration from
// the MESOS_* environment (executor/config), an httpcli client with the
// protobuf codec (mesos-go's default), a SUBSCRIBE stream decoded event
// by event, handlers per event type, UPDATE and MESSAGE calls through an
// httpexec sender, unacknowledged tasks and updates kept for
// re-subscription.
//
// The mesos-go scheduler's "executor" scenario
// (tests/mesos-go/scheduler) launches it on Agora, which fetches it
// into the sandbox through CommandInfo.uris. A task's data says what it
// does: "finish" ends TASK_FINISHED at once, "wait" runs until killed. A
// framework message is answered with "pong: " and the message.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"time"

	"github.com/mesos/mesos-go/api/v1/lib"
	"github.com/mesos/mesos-go/api/v1/lib/encoding"
	"github.com/mesos/mesos-go/api/v1/lib/encoding/codecs"
	"github.com/mesos/mesos-go/api/v1/lib/executor"
	"github.com/mesos/mesos-go/api/v1/lib/executor/calls"
	"github.com/mesos/mesos-go/api/v1/lib/executor/config"
	"github.com/mesos/mesos-go/api/v1/lib/executor/events"
	"github.com/mesos/mesos-go/api/v1/lib/httpcli"
	"github.com/mesos/mesos-go/api/v1/lib/httpcli/httpexec"
)

const (
	apiPath     = "/api/v1/executor"
	httpTimeout = 10 * time.Second
)

var errMustAbort = errors.New("received abort signal from the agent")

type state struct {
	cli            calls.Sender
	cfg            config.Config
	unackedTasks   map[mesos.TaskID]mesos.TaskInfo
	unackedUpdates map[string]executor.Call_Update
	running        map[string]bool
	shouldQuit     bool
}

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	cfg, err := config.FromEnv()
	if err != nil {
		log.Fatal("failed to load configuration: " + err.Error())
	}
	log.Printf("configuration loaded: %+v", cfg)
	if err := run(cfg); err != nil {
		log.Fatal(err)
	}
}

func run(cfg config.Config) error {
	apiURL := url.URL{Scheme: "http", Host: cfg.AgentEndpoint, Path: apiPath}
	http := httpcli.New(
		httpcli.Endpoint(apiURL.String()),
		httpcli.Codec(codecs.ByMediaType[codecs.MediaTypeProtobuf]),
		httpcli.Do(httpcli.With(httpcli.Timeout(httpTimeout))),
	)
	callOptions := executor.CallOptions{
		calls.Framework(cfg.FrameworkID),
		calls.Executor(cfg.ExecutorID),
	}
	st := &state{
		cli:            calls.SenderWith(httpexec.NewSender(http.Send), callOptions...),
		cfg:            cfg,
		unackedTasks:   map[mesos.TaskID]mesos.TaskInfo{},
		unackedUpdates: map[string]executor.Call_Update{},
		running:        map[string]bool{},
	}
	subscriber := calls.SenderWith(
		httpexec.NewSender(http.Send, httpcli.Close(true)),
		callOptions...,
	)
	handler := buildEventHandler(st)
	disconnected := time.Now()
	for {
		subscribe := calls.Subscribe(unacknowledgedTasks(st), unacknowledgedUpdates(st))
		log.Println("subscribing to the agent for events")
		resp, err := subscriber.Send(context.TODO(), calls.NonStreaming(subscribe))
		if err == nil {
			err = eventLoop(st, resp, handler)
			disconnected = time.Now()
		}
		if resp != nil {
			resp.Close()
		}
		if err != nil && err != io.EOF {
			log.Println(err)
		} else {
			log.Println("disconnected")
		}
		if st.shouldQuit {
			log.Println("shutting down as the agent asked")
			return nil
		}
		if !cfg.Checkpoint {
			log.Println("exiting: the framework does not checkpoint")
			return nil
		}
		if time.Since(disconnected) > cfg.RecoveryTimeout {
			return fmt.Errorf("no subscription within %v", cfg.RecoveryTimeout)
		}
		time.Sleep(cfg.SubscriptionBackoffMax)
	}
}

func eventLoop(st *state, decoder encoding.Decoder, h events.Handler) (err error) {
	log.Println("listening for events from the agent")
	for err == nil && !st.shouldQuit {
		var e executor.Event
		if err = decoder.Decode(&e); err == nil {
			err = h.HandleEvent(context.TODO(), &e)
		}
	}
	return err
}

func buildEventHandler(st *state) events.Handler {
	return events.HandlerFuncs{
		executor.Event_SUBSCRIBED: func(_ context.Context, e *executor.Event) error {
			s := e.GetSubscribed()
			executorInfo, frameworkInfo, agentInfo := s.GetExecutorInfo(), s.GetFrameworkInfo(), s.GetAgentInfo()
			if got := executorInfo.ExecutorID.Value; got != st.cfg.ExecutorID {
				return fmt.Errorf("SUBSCRIBED for executor %q, not %q", got, st.cfg.ExecutorID)
			}
			if got := frameworkInfo.GetID().GetValue(); got != st.cfg.FrameworkID {
				return fmt.Errorf("SUBSCRIBED for framework %q, not %q", got, st.cfg.FrameworkID)
			}
			log.Printf("subscribed on agent %s (%s)", agentInfo.GetID().GetValue(), agentInfo.GetHostname())
			return nil
		},
		executor.Event_LAUNCH: func(_ context.Context, e *executor.Event) error {
			task := e.GetLaunch().GetTask()
			st.unackedTasks[task.TaskID] = task
			if err := update(st, task.TaskID, mesos.TASK_RUNNING, ""); err != nil {
				return err
			}
			st.running[task.TaskID.Value] = true
			if string(task.GetData()) == "finish" {
				delete(st.running, task.TaskID.Value)
				return update(st, task.TaskID, mesos.TASK_FINISHED, "finished by the mesos-go executor")
			}
			return nil
		},
		executor.Event_KILL: func(_ context.Context, e *executor.Event) error {
			id := e.GetKill().GetTaskID()
			delete(st.running, id.Value)
			return update(st, id, mesos.TASK_KILLED, "killed by the mesos-go executor")
		},
		executor.Event_ACKNOWLEDGED: func(_ context.Context, e *executor.Event) error {
			ack := e.GetAcknowledged()
			delete(st.unackedTasks, ack.GetTaskID())
			delete(st.unackedUpdates, string(ack.GetUUID()))
			return nil
		},
		executor.Event_MESSAGE: func(ctx context.Context, e *executor.Event) error {
			answer := "pong: " + string(e.GetMessage().GetData())
			return calls.SendNoData(ctx, st.cli, calls.NonStreaming(calls.Message([]byte(answer))))
		},
		executor.Event_SHUTDOWN: func(_ context.Context, _ *executor.Event) error {
			st.shouldQuit = true
			return nil
		},
		executor.Event_ERROR: func(_ context.Context, e *executor.Event) error {
			log.Println("ERROR from the agent:", e.GetError().GetMessage())
			return errMustAbort
		},
	}.Otherwise(func(_ context.Context, e *executor.Event) error {
		log.Printf("unexpected event %v", e.GetType())
		return nil
	})
}

// update sends a status update, keeping it until it is acknowledged.
func update(st *state, taskID mesos.TaskID, state mesos.TaskState, message string) error {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	id[6] = (id[6] & 0x0f) | 0x40
	id[8] = (id[8] & 0x3f) | 0x80
	status := mesos.TaskStatus{
		TaskID:     taskID,
		State:      state.Enum(),
		Source:     mesos.SOURCE_EXECUTOR.Enum(),
		ExecutorID: &mesos.ExecutorID{Value: st.cfg.ExecutorID},
		UUID:       id,
	}
	if message != "" {
		status.Message = &message
	}
	call := calls.Update(status)
	st.unackedUpdates[string(id)] = *call.Update
	if err := calls.SendNoData(context.TODO(), st.cli, calls.NonStreaming(call)); err != nil {
		return fmt.Errorf("UPDATE %s %s: %v", taskID.Value, state, err)
	}
	return nil
}

func unacknowledgedTasks(st *state) (result []mesos.TaskInfo) {
	for _, t := range st.unackedTasks {
		result = append(result, t)
	}
	return
}

func unacknowledgedUpdates(st *state) (result []executor.Call_Update) {
	for _, u := range st.unackedUpdates {
		result = append(result, u)
	}
	return
}

func init() {
	log.SetOutput(os.Stderr)
}
