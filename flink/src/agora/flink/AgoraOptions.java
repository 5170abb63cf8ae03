package agora.flink;

import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.IllegalConfigurationException;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * The Flink configuration keys of Flink on Agora, all under {@code agora.}. A key under {@code
 * agora.} that is not one of these is refused at start-up with its name, so a misspelt option
 * is never silently ignored.
 */
public final class AgoraOptions {

    /** The Agora master: {@code HOST:PORT}, a {@code ws://} URL, or {@code etcd://HOST:PORT/PREFIX}. */
    public static final ConfigOption<String> MASTER =
            ConfigOptions.key("agora.master")
                    .stringType()
                    .noDefaultValue()
                    .withDescription(
                            "The Agora master: HOST:PORT, a ws:// URL, or etcd://HOST:PORT/PREFIX (follows the leading master).");

    public static final ConfigOption<String> FRAMEWORK_NAME =
            ConfigOptions.key("agora.framework-name")
                    .stringType()
                    .defaultValue("flink")
                    .withDescription("The framework name the JobManager registers with.");

    public static final ConfigOption<String> ROLE =
            ConfigOptions.key("agora.role")
                    .stringType()
                    .noDefaultValue()
                    .withDescription("The role the TaskManagers run in (default *).");

    public static final ConfigOption<String> PRINCIPAL =
            ConfigOptions.key("agora.principal")
                    .stringType()
                    .noDefaultValue()
                    .withDescription("Principal for a master that authenticates frameworks.");

    public static final ConfigOption<String> SECRET_FILE =
            ConfigOptions.key("agora.secret-file")
                    .stringType()
                    .noDefaultValue()
                    .withDescription("File whose first line is the principal's secret.");

    public static final ConfigOption<Duration> FAILOVER_TIMEOUT =
            ConfigOptions.key("agora.failover-timeout")
                    .durationType()
                    .defaultValue(Duration.ofDays(7))
                    .withDescription(
                            "How long Agora keeps the TaskManagers of a JobManager that is gone.");

    public static final ConfigOption<String> STORE =
            ConfigOptions.key("agora.store")
                    .stringType()
                    .defaultValue("memory")
                    .withDescription(
                            "Where the driver records its TaskManagers: memory (nothing survives the JobManager), "
                                    + "file:PATH, or etcd://HOST:PORT/PREFIX (fenced by an election).");

    public static final ConfigOption<String> BRIDGE =
            ConfigOptions.key("agora.bridge")
                    .stringType()
                    .noDefaultValue()
                    .withDescription(
                            "Path of agora-flink-bridge (default: $AGORA_FLINK_BRIDGE, else agora-flink-bridge on the PATH).");

    public static final ConfigOption<Duration> BRIDGE_START_TIMEOUT =
            ConfigOptions.key("agora.bridge.start-timeout")
                    .durationType()
                    .defaultValue(Duration.ofSeconds(90))
                    .withDescription(
                            "How long the driver waits for the bridge to load its store (and, with etcd, to win its election).");

    public static final ConfigOption<Double> TASK_MANAGER_CPUS =
            ConfigOptions.key("agora.taskmanager.cpus")
                    .doubleType()
                    .defaultValue(-1.0)
                    .withDescription(
                            "cpus of each TaskManager task (default: taskmanager.cpu.cores, else the number of slots).");

    public static final ConfigOption<Integer> TASK_MANAGER_DISK =
            ConfigOptions.key("agora.taskmanager.disk")
                    .intType()
                    .defaultValue(0)
                    .withDescription("Disk (MB) of each TaskManager task; 0 asks for none.");

    public static final ConfigOption<List<String>> TASK_MANAGER_CONSTRAINTS =
            ConfigOptions.key("agora.taskmanager.constraints")
                    .stringType()
                    .asList()
                    .noDefaultValue()
                    .withDescription(
                            "Hard placement constraints, FIELD:OP[:VALUE] separated by ';' "
                                    + "(OP: EQUALS, CLUSTER, LIKE, UNLIKE, UNIQUE, MAX_PER; FIELD an agent attribute or hostname).");

    public static final ConfigOption<List<String>> LOCALITY_HOSTS =
            ConfigOptions.key("agora.locality.hosts")
                    .stringType()
                    .asList()
                    .noDefaultValue()
                    .withDescription(
                            "Hosts the TaskManagers should run on (where the job's input is), separated by ';'. "
                                    + "The n-th TaskManager prefers the (n mod k)-th host, then its rack, then any agent, "
                                    + "one agora.locality.wait per level.");

    public static final ConfigOption<List<String>> LOCALITY_RACKS =
            ConfigOptions.key("agora.locality.racks")
                    .stringType()
                    .asList()
                    .noDefaultValue()
                    .withDescription("Racks the TaskManagers should run in, separated by ';'.");

    public static final ConfigOption<Duration> LOCALITY_WAIT =
            ConfigOptions.key("agora.locality.wait")
                    .durationType()
                    .defaultValue(Duration.ofSeconds(3))
                    .withDescription("Wait per locality level (host, rack, any).");

    public static final ConfigOption<String> TASK_MANAGER_FLINK_HOME =
            ConfigOptions.key("agora.taskmanager.flink-home")
                    .stringType()
                    .noDefaultValue()
                    .withDescription(
                            "FLINK_HOME on the agents (default: the JobManager's FLINK_HOME).");

    public static final ConfigOption<String> TASK_MANAGER_HOST =
            ConfigOptions.key("agora.taskmanager.host")
                    .stringType()
                    .defaultValue("$AGORA_WORKER_HOST")
                    .withDescription(
                            "The address a TaskManager advertises; may name the task's environment (default $AGORA_WORKER_HOST, the agent's host name).");

    public static final ConfigOption<String> TASK_MANAGER_BIND_HOST =
            ConfigOptions.key("agora.taskmanager.bind-host")
                    .stringType()
                    .defaultValue("0.0.0.0")
                    .withDescription("The address a TaskManager binds to.");

    public static final ConfigOption<Boolean> TASK_MANAGER_OFFER_PORTS =
            ConfigOptions.key("agora.taskmanager.offer-ports")
                    .booleanType()
                    .defaultValue(true)
                    .withDescription(
                            "Take the TaskManager's RPC and data ports from the offer (agents must offer ports); "
                                    + "false lets the TaskManager pick free ports itself.");

    public static final ConfigOption<Duration> TASK_MANAGER_KILL_GRACE_PERIOD =
            ConfigOptions.key("agora.taskmanager.kill-grace-period")
                    .durationType()
                    .defaultValue(Duration.ofSeconds(5))
                    .withDescription("Between SIGTERM and SIGKILL when a TaskManager is released.");

    private AgoraOptions() {}

    /** Every key above. */
    static Set<String> keys() {
        Set<String> keys = new HashSet<>();
        for (Field field : AgoraOptions.class.getDeclaredFields()) {
            if (Modifier.isStatic(field.getModifiers())
                    && ConfigOption.class.isAssignableFrom(field.getType())) {
                try {
                    keys.add(((ConfigOption<?>) field.get(null)).key());
                } catch (IllegalAccessException e) {
                    throw new IllegalStateException(e);
                }
            }
        }
        return keys;
    }

    /** Refuses unknown {@code agora.} keys and a missing master. */
    static void validate(Configuration config) {
        Set<String> known = keys();
        List<String> unknown = new ArrayList<>();
        for (String key : config.keySet()) {
            if (key.startsWith("agora.") && !known.contains(key)) {
                unknown.add(key);
            }
        }
        if (!unknown.isEmpty()) {
            throw new IllegalConfigurationException(
                    "Unknown Flink-on-Agora configuration keys "
                            + unknown
                            + "; the keys are "
                            + new java.util.TreeSet<>(known));
        }
        if (!config.getOptional(MASTER).isPresent()) {
            throw new IllegalConfigurationException(
                    "agora.master is not set: say which Agora master to use (HOST:PORT or etcd://HOST:PORT/PREFIX)");
        }
        boolean principal = config.getOptional(PRINCIPAL).isPresent();
        boolean secret = config.getOptional(SECRET_FILE).isPresent();
        if (principal != secret) {
            throw new IllegalConfigurationException(
                    "agora.principal and agora.secret-file go together: set both or neither");
        }
    }
}
