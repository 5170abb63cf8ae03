package agora.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.clusterframework.ApplicationStatus;
import org.apache.flink.runtime.clusterframework.TaskExecutorProcessSpec;
import org.apache.flink.runtime.clusterframework.types.ResourceID;
import org.apache.flink.runtime.resourcemanager.active.AbstractResourceManagerDriver;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.flink.util.FlinkException;

import javax.annotation.Nullable;

import java.io.File;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Flink's {@code ResourceManagerDriver} for Agora: TaskManagers are Agora tasks, requested and
 * released through {@code agora-flink-bridge}, which runs {@code agora-workers}' worker driver
 * (offers, placement and locality, the write-ahead worker store, reconciliation, master
 * failover).
 *
 * <ul>
 *   <li>{@link #requestResource} sends a {@code request}; its future completes on {@code placed},
 *       which the bridge writes after the worker is durably recorded and before its task is
 *       sent, so before the TaskManager can register.
 *   <li>{@link #releaseResource} sends {@code release}: the task is killed.
 *   <li>{@link #terminate} closes the bridge in failover mode: TaskManagers keep running for
 *       the next JobManager, which gets them from {@code onPreviousAttemptWorkersRecovered}.
 *   <li>{@link #deregisterApplication} tears the framework down: every TaskManager ends.
 * </ul>
 *
 * Every event of the bridge reaches Flink's resource manager on its main thread, in order.
 */
public class AgoraResourceManagerDriver extends AbstractResourceManagerDriver<AgoraWorkerNode> {
    private static final long CLOSE_TIMEOUT_MS = 15_000;

    private final String rpcAddress;
    @Nullable private final String webInterfaceUrl;

    private final Map<Long, CompletableFuture<AgoraWorkerNode>> pending =
            new ConcurrentHashMap<>();
    private final AtomicLong nextRequest = new AtomicLong(1);
    private final AtomicLong requested = new AtomicLong();
    private final CompletableFuture<List<AgoraWorkerNode>> recovered = new CompletableFuture<>();
    private final CompletableFuture<String> ended = new CompletableFuture<>();
    private volatile boolean stopping;
    private Bridge bridge;

    public AgoraResourceManagerDriver(
            Configuration flinkConfig, String rpcAddress, @Nullable String webInterfaceUrl) {
        super(flinkConfig, flinkConfig);
        this.rpcAddress = rpcAddress;
        this.webInterfaceUrl = webInterfaceUrl;
    }

    @Override
    protected void initializeInternal() throws Exception {
        AgoraOptions.validate(flinkConfig);
        bridge = Bridge.start(bridgeCommand(), this::onEvent, this::onBridgeClosed);
        Duration timeout = flinkConfig.get(AgoraOptions.BRIDGE_START_TIMEOUT);
        List<AgoraWorkerNode> workers;
        try {
            workers = recovered.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            bridge.close(CLOSE_TIMEOUT_MS);
            throw new FlinkException(
                    "agora-flink-bridge did not load its worker store within " + timeout, e);
        }
        log.info(
                "Agora: {} TaskManager(s) of previous attempts recovered: {}",
                workers.size(),
                workers);
        getResourceEventHandler().onPreviousAttemptWorkersRecovered(workers);
    }

    @Override
    public void terminate() throws Exception {
        stopping = true;
        if (bridge == null) {
            return;
        }
        if (bridge.isAlive()) {
            ObjectNode command = Bridge.JSON.createObjectNode();
            command.put("op", "terminate");
            bridge.send(command);
        }
        bridge.close(CLOSE_TIMEOUT_MS);
        failPending("the resource manager terminated");
        log.info("Agora: the bridge stopped; TaskManagers keep running for the next attempt");
    }

    @Override
    public void deregisterApplication(ApplicationStatus finalStatus, @Nullable String diagnostics)
            throws Exception {
        stopping = true;
        if (bridge == null || !bridge.isAlive()) {
            log.warn("Agora: cannot deregister, the bridge has ended");
            return;
        }
        ObjectNode command = Bridge.JSON.createObjectNode();
        command.put("op", "deregister");
        command.put("status", status(finalStatus));
        if (diagnostics != null) {
            command.put("diagnostics", diagnostics);
        }
        log.info("Agora: deregistering ({}): every TaskManager ends", finalStatus);
        if (bridge.send(command)) {
            try {
                String reason = ended.get(60, TimeUnit.SECONDS);
                log.info("Agora: the bridge ended: {}", reason);
            } catch (TimeoutException e) {
                log.warn("Agora: the bridge did not confirm the deregistration within 60 s");
            }
        }
        failPending("the application deregistered");
    }

    @Override
    public CompletableFuture<AgoraWorkerNode> requestResource(TaskExecutorProcessSpec spec) {
        CompletableFuture<AgoraWorkerNode> future = new CompletableFuture<>();
        long request = nextRequest.getAndIncrement();
        ObjectNode command;
        try {
            command = requestCommand(request, spec);
        } catch (RuntimeException e) {
            future.completeExceptionally(e);
            return future;
        }
        pending.put(request, future);
        if (stopping || bridge == null || !bridge.send(command)) {
            pending.remove(request);
            future.completeExceptionally(new FlinkException("agora-flink-bridge is not running"));
            return future;
        }
        log.info(
                "Agora: requested TaskManager #{} ({})",
                request,
                TaskManagerLaunch.resources(flinkConfig, spec));
        return future;
    }

    @Override
    public void releaseResource(AgoraWorkerNode worker) {
        log.info("Agora: releasing TaskManager {}", worker);
        ObjectNode command = Bridge.JSON.createObjectNode();
        command.put("op", "release");
        command.put("worker", worker.getResourceID().getResourceIdString());
        if (bridge != null) {
            bridge.send(command);
        }
    }

    // --- the bridge's events (on its reader thread) ---

    private void onEvent(JsonNode event) {
        String type = event.path("event").asText();
        switch (type) {
            case "recovered":
                {
                    List<AgoraWorkerNode> workers = new ArrayList<>();
                    for (JsonNode worker : event.path("workers")) {
                        workers.add(node(worker));
                    }
                    recovered.complete(workers);
                    break;
                }
            case "placed":
                {
                    long request = event.path("request").asLong();
                    AgoraWorkerNode worker = node(event.path("worker"));
                    CompletableFuture<AgoraWorkerNode> future = pending.remove(request);
                    log.info("Agora: TaskManager #{} is {}", request, worker);
                    if (future != null) {
                        getMainThreadExecutor().execute(() -> future.complete(worker));
                    }
                    break;
                }
            case "request_failed":
                {
                    long request = event.path("request").asLong();
                    String error = event.path("error").asText();
                    CompletableFuture<AgoraWorkerNode> future = pending.remove(request);
                    log.warn("Agora: request #{} failed: {}", request, error);
                    if (future != null) {
                        getMainThreadExecutor()
                                .execute(
                                        () ->
                                                future.completeExceptionally(
                                                        new FlinkException(
                                                                "Agora could not start the TaskManager: "
                                                                        + error)));
                    }
                    break;
                }
            case "running":
                log.info("Agora: TaskManager {} is running", event.path("worker").asText());
                break;
            case "terminated":
                {
                    ResourceID id = new ResourceID(event.path("worker").asText());
                    String diagnostics =
                            "Agora task ended ("
                                    + event.path("cause").asText()
                                    + "): "
                                    + event.path("diagnostics").asText();
                    log.info("Agora: TaskManager {} ended: {}", id, diagnostics);
                    getMainThreadExecutor()
                            .execute(
                                    () ->
                                            getResourceEventHandler()
                                                    .onWorkerTerminated(id, diagnostics));
                    break;
                }
            case "connection":
                log.info("Agora: connection to the master: {}", event.path("state").asText());
                break;
            case "refused":
                log.error(
                        "Agora: the bridge refused {}: {}",
                        event.path("line").asText(),
                        event.path("error").asText());
                break;
            case "error":
                {
                    String message = event.path("message").asText();
                    log.error("Agora: {}", message);
                    if (!stopping) {
                        recovered.completeExceptionally(new FlinkException(message));
                        getMainThreadExecutor()
                                .execute(
                                        () ->
                                                getResourceEventHandler()
                                                        .onError(
                                                                new FlinkException(
                                                                        "Agora: " + message)));
                    }
                    break;
                }
            case "ended":
                ended.complete(event.path("reason").asText());
                break;
            default:
                log.warn("Agora: unknown event from the bridge: {}", event);
        }
    }

    private void onBridgeClosed() {
        ended.complete("the bridge's output closed");
        recovered.completeExceptionally(
                new FlinkException("agora-flink-bridge exited before loading its worker store"));
        if (!stopping) {
            log.error("Agora: agora-flink-bridge exited while the resource manager runs");
            getMainThreadExecutor()
                    .execute(
                            () ->
                                    getResourceEventHandler()
                                            .onError(
                                                    new FlinkException(
                                                            "agora-flink-bridge exited unexpectedly")));
        }
        failPending("agora-flink-bridge exited");
    }

    private void failPending(String why) {
        for (Long request : new ArrayList<>(pending.keySet())) {
            CompletableFuture<AgoraWorkerNode> future = pending.remove(request);
            if (future != null) {
                future.completeExceptionally(new FlinkException(why));
            }
        }
    }

    // --- commands ---

    private ObjectNode requestCommand(long request, TaskExecutorProcessSpec spec) {
        ObjectNode command = Bridge.JSON.createObjectNode();
        command.put("op", "request");
        command.put("request", request);
        ObjectNode s = command.putObject("spec");
        s.put("name", "taskmanager");
        s.put("resources", TaskManagerLaunch.resources(flinkConfig, spec));
        if (flinkConfig.get(AgoraOptions.TASK_MANAGER_OFFER_PORTS)) {
            s.putArray("ports").add("rpc").add("data");
        }
        s.put("command", TaskManagerLaunch.command(flinkConfig, spec));
        ObjectNode env = s.putObject("env");
        TaskManagerLaunch.environment(flinkConfig, rpcAddress).forEach(env::put);
        s.put(
                "kill_grace_period",
                flinkConfig.get(AgoraOptions.TASK_MANAGER_KILL_GRACE_PERIOD).toMillis() / 1000.0);
        ArrayNode constraints = s.putArray("constraints");
        for (String c :
                flinkConfig
                        .getOptional(AgoraOptions.TASK_MANAGER_CONSTRAINTS)
                        .orElse(Collections.emptyList())) {
            constraints.add(c.trim());
        }
        // The n-th TaskManager prefers the (n mod k)-th host, so k hosts each get their share.
        List<String> hosts =
                flinkConfig
                        .getOptional(AgoraOptions.LOCALITY_HOSTS)
                        .orElse(Collections.emptyList());
        long n = requested.getAndIncrement();
        if (!hosts.isEmpty()) {
            s.putArray("prefer_hosts")
                    .addObject()
                    .put("name", hosts.get((int) (n % hosts.size())).trim())
                    .put("weight", 1.0);
        }
        ArrayNode racks = s.putArray("prefer_racks");
        for (String rack :
                flinkConfig
                        .getOptional(AgoraOptions.LOCALITY_RACKS)
                        .orElse(Collections.emptyList())) {
            racks.addObject().put("name", rack.trim()).put("weight", 1.0);
        }
        s.put("locality_wait_ms", flinkConfig.get(AgoraOptions.LOCALITY_WAIT).toMillis());
        return command;
    }

    private List<String> bridgeCommand() {
        List<String> command = new ArrayList<>();
        String bridgePath =
                flinkConfig
                        .getOptional(AgoraOptions.BRIDGE)
                        .orElseGet(
                                () ->
                                        System.getenv()
                                                .getOrDefault(
                                                        "AGORA_FLINK_BRIDGE",
                                                        "agora-flink-bridge"));
        command.add(bridgePath);
        command.add("--master");
        command.add(flinkConfig.get(AgoraOptions.MASTER));
        command.add("--name");
        command.add(flinkConfig.get(AgoraOptions.FRAMEWORK_NAME));
        command.add("--store");
        command.add(flinkConfig.get(AgoraOptions.STORE));
        command.add("--hostname");
        command.add(rpcAddress);
        command.add("--failover-timeout");
        command.add(
                Double.toString(flinkConfig.get(AgoraOptions.FAILOVER_TIMEOUT).toMillis() / 1000.0));
        command.add("--locality-wait-ms");
        command.add(Long.toString(flinkConfig.get(AgoraOptions.LOCALITY_WAIT).toMillis()));
        flinkConfig
                .getOptional(AgoraOptions.ROLE)
                .ifPresent(
                        role -> {
                            command.add("--role");
                            command.add(role);
                        });
        if (flinkConfig.getOptional(AgoraOptions.PRINCIPAL).isPresent()) {
            command.add("--principal");
            command.add(flinkConfig.get(AgoraOptions.PRINCIPAL));
            command.add("--secret-file");
            command.add(new File(flinkConfig.get(AgoraOptions.SECRET_FILE)).getAbsolutePath());
        }
        if (webInterfaceUrl != null && !webInterfaceUrl.isEmpty()) {
            command.add("--webui-url");
            command.add(webInterfaceUrl);
        }
        return command;
    }

    private static AgoraWorkerNode node(JsonNode worker) {
        return new AgoraWorkerNode(
                worker.path("id").asText(),
                worker.path("hostname").asText(),
                worker.path("agent_id").asText(),
                worker.path("locality").asText());
    }

    private static String status(ApplicationStatus status) {
        switch (status) {
            case SUCCEEDED:
                return "succeeded";
            case FAILED:
                return "failed";
            case CANCELED:
                return "canceled";
            default:
                return "unknown";
        }
    }
}
