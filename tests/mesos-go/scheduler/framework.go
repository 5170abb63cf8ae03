package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	"github.com/mesos/mesos-go/api/v1/lib"
	"github.com/mesos/mesos-go/api/v1/lib/backoff"
	"github.com/mesos/mesos-go/api/v1/lib/extras/scheduler/callrules"
	"github.com/mesos/mesos-go/api/v1/lib/extras/scheduler/controller"
	"github.com/mesos/mesos-go/api/v1/lib/extras/scheduler/eventrules"
	"github.com/mesos/mesos-go/api/v1/lib/extras/store"
	"github.com/mesos/mesos-go/api/v1/lib/httpcli"
	"github.com/mesos/mesos-go/api/v1/lib/httpcli/httpsched"
	"github.com/mesos/mesos-go/api/v1/lib/resources"
	"github.com/mesos/mesos-go/api/v1/lib/scheduler"
	"github.com/mesos/mesos-go/api/v1/lib/scheduler/calls"
	"github.com/mesos/mesos-go/api/v1/lib/scheduler/events"
)

const (
	// failoverTimeout lets a framework outlive its scheduler (failover)
	// and the master (restart); with it the controller re-subscribes
	// with the framework id it holds.
	failoverTimeout = 300 * time.Second
	taskCPUs        = 0.1
	taskMem         = 32
)

// observed is what the event handlers hand to the scenario.
type observed struct {
	kind         string // "subscribed", "update", "message" or "error"
	frameworkID  string
	status       *mesos.TaskStatus
	errorMessage string
	message      *scheduler.Event_Message
}

// pendingTask is a task waiting for an offer: a command task, or one
// of a custom executor with its data.
type pendingTask struct {
	id, command string
	executor    *mesos.ExecutorInfo
	data        []byte
}

// framework launches queued command tasks on offers and hands every
// subscription, status update and error to the scenario.
type framework struct {
	cli      calls.Caller
	fidStore store.Singleton
	info     *mesos.FrameworkInfo
	wants    mesos.Resources

	observed chan observed
	backlog  []observed

	mu            sync.Mutex
	toLaunch      []pendingTask
	agents        map[string]string // task id -> agent id, from updates
	subscriptions int

	stopTokens chan struct{}
	tokensDone chan struct{}
	cancel     context.CancelFunc
	finished   chan error
}

func newFramework(cfg config, frameworkID string, capabilities ...mesos.FrameworkInfo_Capability_Type) *framework {
	fidStore := store.DecorateSingleton(
		store.NewInMemorySingleton(),
		store.DoSet().AndThen(func(_ store.Setter, v string, _ error) error {
			log.Println("FrameworkID", v)
			return nil
		}))
	if frameworkID != "" {
		fidStore.Set(frameworkID)
	}
	seconds := failoverTimeout.Seconds()
	info := &mesos.FrameworkInfo{
		User:            "",
		Name:            "mesos-go test framework (" + cfg.codec.Name + ")",
		FailoverTimeout: &seconds,
	}
	for _, c := range capabilities {
		info.Capabilities = append(info.Capabilities, mesos.FrameworkInfo_Capability{Type: c})
	}
	var wants mesos.Resources
	wants.Add(
		resources.NewCPUs(taskCPUs).Resource,
		resources.NewMemory(taskMem).Resource,
	)
	cli := httpcli.New(
		httpcli.Endpoint(cfg.url),
		httpcli.Codec(cfg.codec),
		httpcli.Do(httpcli.With(httpcli.Timeout(10*time.Second))),
	)
	fw := &framework{
		fidStore: fidStore,
		info:     info,
		wants:    wants,
		observed: make(chan observed, 4096),
		agents:   map[string]string{},
	}
	fw.cli = callrules.New(
		callrules.WithFrameworkID(store.GetIgnoreErrors(fidStore)),
		logCalls(),
	).Caller(httpsched.NewCaller(cli, httpsched.AllowReconnection(true)))
	return fw
}

// start runs the controller's subscribe loop until stop.
func (fw *framework) start() {
	ctx, cancel := context.WithCancel(context.Background())
	fw.cancel = cancel
	fw.stopTokens = make(chan struct{})
	fw.tokensDone = make(chan struct{})
	fw.finished = make(chan error, 1)
	go func() {
		fw.finished <- controller.Run(
			ctx,
			fw.info,
			fw.cli,
			controller.WithEventHandler(fw.eventHandler()),
			controller.WithFrameworkID(store.GetIgnoreErrors(fw.fidStore)),
			controller.WithRegistrationTokens(fw.registrationTokens(ctx)),
			controller.WithSubscriptionTerminated(func(err error) {
				if err != nil && err != io.EOF {
					log.Println("subscription ended:", err)
				} else {
					log.Println("disconnected")
				}
			}),
		)
	}()
}

// registrationTokens paces (re-)subscriptions with mesos-go's backoff
// notifier; once stopTokens is closed the channel closes, which ends
// controller.Run after the current subscription instead of subscribing
// again.
func (fw *framework) registrationTokens(ctx context.Context) <-chan struct{} {
	tokens := make(chan struct{})
	notifier := backoff.Notifier(200*time.Millisecond, 2*time.Second, ctx.Done())
	go func() {
		defer close(fw.tokensDone)
		defer close(tokens)
		for {
			select {
			case <-fw.stopTokens:
				return
			case <-notifier:
			}
			select {
			case <-fw.stopTokens:
				return
			case tokens <- struct{}{}:
			}
		}
	}()
	return tokens
}

// teardown ends the framework: no more subscriptions, then TEARDOWN,
// and waits for the controller to return.
func (fw *framework) teardown() {
	close(fw.stopTokens)
	<-fw.tokensDone
	ctx, cancel := waitContext()
	defer cancel()
	if err := calls.CallNoData(ctx, fw.cli, &scheduler.Call{Type: scheduler.Call_TEARDOWN}); err != nil {
		fail("TEARDOWN: %v", err)
	}
	select {
	case err := <-fw.finished:
		log.Println("controller returned:", err)
	case <-time.After(timeout):
		fail("the subscription did not end after TEARDOWN")
	}
	fw.cancel()
}

func (fw *framework) eventHandler() events.Handler {
	return eventrules.New(
		fw.reportErrors(),
		controller.LiftErrors().DropOnError(),
	).Handle(events.Handlers{
		scheduler.Event_SUBSCRIBED: eventrules.New(
			controller.TrackSubscription(fw.fidStore, failoverTimeout),
		).HandleF(fw.subscribed),
		scheduler.Event_OFFERS:  events.HandlerFunc(fw.resourceOffers),
		scheduler.Event_UPDATE:  controller.AckStatusUpdates(fw.cli).AndThen().HandleF(fw.statusUpdate),
		scheduler.Event_MESSAGE: events.HandlerFunc(fw.frameworkMessage),
	})
}

// reportErrors hands ERROR events to the scenario before LiftErrors
// turns them into the error that ends the subscription.
func (fw *framework) reportErrors() eventrules.Rule {
	return func(ctx context.Context, e *scheduler.Event, err error, chain eventrules.Chain) (context.Context, *scheduler.Event, error) {
		if e.GetType() == scheduler.Event_ERROR {
			message := e.GetError().GetMessage()
			say("error", map[string]interface{}{"message": message})
			fw.observed <- observed{kind: "error", errorMessage: message}
		}
		return chain(ctx, e, err)
	}
}

func (fw *framework) subscribed(_ context.Context, e *scheduler.Event) error {
	id := e.GetSubscribed().GetFrameworkID().GetValue()
	fw.mu.Lock()
	fw.subscriptions++
	n := fw.subscriptions
	fw.mu.Unlock()
	if n == 1 {
		say("registered", map[string]interface{}{"framework_id": id})
	} else {
		say("reregistered", map[string]interface{}{"framework_id": id})
	}
	fw.observed <- observed{kind: "subscribed", frameworkID: id}
	return nil
}

func (fw *framework) resourceOffers(ctx context.Context, e *scheduler.Event) error {
	offers := e.GetOffers().GetOffers()
	for i := range offers {
		var (
			remaining = mesos.Resources(offers[i].Resources)
			tasks     = []mesos.TaskInfo{}
			launched  = []pendingTask{}
		)
		flattened := mesos.Resources(resources.Flatten(remaining))
		fw.mu.Lock()
		for len(fw.toLaunch) > 0 && resources.ContainsAll(flattened, fw.wants) {
			next := fw.toLaunch[0]
			fw.toLaunch = fw.toLaunch[1:]
			task := mesos.TaskInfo{
				Name:      next.id,
				TaskID:    mesos.TaskID{Value: next.id},
				AgentID:   offers[i].AgentID,
				Resources: resources.Find(resources.Flatten(fw.wants), remaining...),
			}
			if next.executor != nil {
				task.Executor = next.executor
				task.Data = next.data
			} else {
				command := next.command
				task.Command = &mesos.CommandInfo{Value: &command}
			}
			launched = append(launched, next)
			remaining.Subtract(task.Resources...)
			flattened = resources.Flatten(remaining)
			tasks = append(tasks, task)
		}
		fw.mu.Unlock()
		// mesos-go frameworks accept every offer: with no task the
		// ACCEPT declines it.
		accept := calls.Accept(
			calls.OfferOperations{calls.OpLaunch(tasks...)}.WithOffers(offers[i].ID),
		).With(calls.RefuseSeconds(time.Second))
		if err := calls.CallNoData(ctx, fw.cli, accept); err != nil {
			log.Printf("failed to launch tasks: %+v", err)
			fw.mu.Lock()
			fw.toLaunch = append(fw.toLaunch, launched...)
			fw.mu.Unlock()
		} else if len(tasks) > 0 {
			log.Printf("launched %d task(s) on offer %s", len(tasks), offers[i].ID.Value)
		}
	}
	return nil
}

func (fw *framework) statusUpdate(_ context.Context, e *scheduler.Event) error {
	s := e.GetUpdate().GetStatus()
	reliable := len(s.GetUUID()) > 0
	say("update", map[string]interface{}{
		"task_id":  s.TaskID.Value,
		"state":    s.GetState().String(),
		"reason":   reasonOf(&s),
		"source":   s.GetSource().String(),
		"reliable": reliable,
		"agent_id": s.GetAgentID().GetValue(),
	})
	if reliable && s.GetAgentID().GetValue() == "" {
		fail("a status update with a uuid and no agent id: %v", s)
	}
	if id := s.GetAgentID().GetValue(); id != "" {
		fw.mu.Lock()
		fw.agents[s.TaskID.Value] = id
		fw.mu.Unlock()
	}
	status := s
	fw.observed <- observed{kind: "update", status: &status}
	return nil
}

func (fw *framework) frameworkMessage(_ context.Context, e *scheduler.Event) error {
	m := e.GetMessage()
	say("message", map[string]interface{}{
		"agent_id":    m.AgentID.Value,
		"executor_id": m.ExecutorID.Value,
		"data":        string(m.Data),
	})
	fw.observed <- observed{kind: "message", message: m}
	return nil
}

func reasonOf(s *mesos.TaskStatus) interface{} {
	if s.Reason == nil {
		return nil
	}
	return s.GetReason().String()
}

// launch queues a command task and revives offers for it.
func (fw *framework) launch(id, command string) {
	fw.queue(pendingTask{id: id, command: command})
}

// launchWith queues a task of a custom executor, with its data.
func (fw *framework) launchWith(id string, executor *mesos.ExecutorInfo, data string) {
	fw.queue(pendingTask{id: id, executor: executor, data: []byte(data)})
}

func (fw *framework) queue(task pendingTask) {
	fw.mu.Lock()
	fw.toLaunch = append(fw.toLaunch, task)
	fw.mu.Unlock()
	fw.call("REVIVE", calls.Revive())
}

// call sends a call that answers no data; any error ends the scenario.
func (fw *framework) call(what string, call *scheduler.Call) {
	ctx, cancel := waitContext()
	defer cancel()
	if err := calls.CallNoData(ctx, fw.cli, call); err != nil {
		fail("%s: %v", what, err)
	}
}

// kill kills a task on the agent its updates came from.
func (fw *framework) kill(taskID string) {
	fw.mu.Lock()
	agent := fw.agents[taskID]
	fw.mu.Unlock()
	fw.call("KILL "+taskID, calls.Kill(taskID, agent))
}

// reconcile asks for the state of tasks (task id -> agent id, may be
// empty); with none, of every task the master knows (implicit).
func (fw *framework) reconcile(tasks map[string]string) {
	fw.call("RECONCILE", calls.Reconcile(calls.ReconcileTasks(tasks)))
}

// expect takes the first event, seen or still to come, that match
// accepts; an ERROR event or the timeout fails the scenario.
func (fw *framework) expect(what string, match func(observed) bool) observed {
	for i, o := range fw.backlog {
		if match(o) {
			fw.backlog = append(fw.backlog[:i], fw.backlog[i+1:]...)
			return o
		}
	}
	deadline := time.After(timeout)
	for {
		select {
		case o := <-fw.observed:
			if o.kind == "error" {
				fail("ERROR event while waiting for %s: %s", what, o.errorMessage)
			}
			if match(o) {
				return o
			}
			fw.backlog = append(fw.backlog, o)
		case <-deadline:
			fail("timed out waiting for %s", what)
		}
	}
}

// expectWithin is expect with a shorter bound; false when it passed.
func (fw *framework) expectWithin(d time.Duration, match func(observed) bool) bool {
	deadline := time.After(d)
	for {
		select {
		case o := <-fw.observed:
			if o.kind == "error" {
				fail("ERROR event: %s", o.errorMessage)
			}
			if match(o) {
				return true
			}
			fw.backlog = append(fw.backlog, o)
		case <-deadline:
			return false
		}
	}
}

func isSubscribed(o observed) bool { return o.kind == "subscribed" }

// updateOf matches an update of task in one of states.
func updateOf(task string, states ...mesos.TaskState) func(observed) bool {
	return func(o observed) bool {
		if o.kind != "update" || o.status.TaskID.Value != task {
			return false
		}
		for _, s := range states {
			if o.status.GetState() == s {
				return true
			}
		}
		return false
	}
}

// logCalls logs each outgoing call and its outcome.
func logCalls() callrules.Rule {
	return func(ctx context.Context, c *scheduler.Call, r mesos.Response, err error, ch callrules.Chain) (context.Context, *scheduler.Call, mesos.Response, error) {
		ctx, c, r, err = ch(ctx, c, r, err)
		if err != nil {
			log.Printf("call %s: %v", c.GetType(), err)
		} else {
			log.Printf("call %s: ok", c.GetType())
		}
		return ctx, c, r, err
	}
}

func (o observed) String() string {
	switch o.kind {
	case "update":
		return fmt.Sprintf("update %s %s", o.status.TaskID.Value, o.status.GetState())
	case "subscribed":
		return "subscribed " + o.frameworkID
	case "message":
		return "message " + string(o.message.Data)
	}
	return o.kind + " " + o.errorMessage
}
