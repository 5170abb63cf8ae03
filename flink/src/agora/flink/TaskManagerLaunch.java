package agora.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ConfigurationUtils;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.configuration.JobManagerOptions;
import org.apache.flink.configuration.NettyShuffleEnvironmentOptions;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.runtime.clusterframework.TaskExecutorProcessSpec;
import org.apache.flink.runtime.clusterframework.TaskExecutorProcessUtils;

import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;

/**
 * How a TaskManager starts as an Agora task: {@code taskmanager.sh start-foreground} in the
 * task's sandbox, with a {@code config.yaml} written from the JobManager's configuration (carried
 * in the task's environment, so agents need no shared file system), the Agora worker id as its
 * resource id, the offer's ports, and the memory sizes Flink computed for the request.
 */
final class TaskManagerLaunch {
    /** The environment variable carrying the TaskManager's config.yaml. */
    static final String CONFIG_ENV = "AGORA_FLINK_CONFIG";

    private TaskManagerLaunch() {}

    /** The resources of the task: cpus and memory from the spec, disk from the configuration. */
    static String resources(Configuration config, TaskExecutorProcessSpec spec) {
        double cpus = spec.getCpuCores().getValue().doubleValue();
        long mem = spec.getTotalProcessMemorySize().getMebiBytes();
        StringBuilder resources =
                new StringBuilder(String.format(Locale.ROOT, "cpus:%s;mem:%d", trim(cpus), mem));
        int disk = config.get(AgoraOptions.TASK_MANAGER_DISK);
        if (disk > 0) {
            resources.append(";disk:").append(disk);
        }
        return resources.toString();
    }

    /** The task's shell command. */
    static String command(Configuration config, TaskExecutorProcessSpec spec) {
        StringBuilder flags = new StringBuilder();
        flag(flags, TaskManagerOptions.TASK_MANAGER_RESOURCE_ID.key(), "$AGORA_WORKER_ID");
        flag(flags, TaskManagerOptions.HOST.key(), config.get(AgoraOptions.TASK_MANAGER_HOST));
        flag(flags, TaskManagerOptions.BIND_HOST.key(), config.get(AgoraOptions.TASK_MANAGER_BIND_HOST));
        flag(flags, CoreOptions.TMP_DIRS.key(), "$PWD/tmp");
        if (config.get(AgoraOptions.TASK_MANAGER_OFFER_PORTS)) {
            flag(flags, TaskManagerOptions.RPC_PORT.key(), "$AGORA_PORT_RPC");
            flag(flags, NettyShuffleEnvironmentOptions.DATA_PORT.key(), "$AGORA_PORT_DATA");
        }
        // "-D key=value …" with numeric values and Flink's own keys: safe unquoted.
        String memory = TaskExecutorProcessUtils.generateDynamicConfigsStr(spec);
        return "mkdir -p conf log tmp"
                + " && printf '%s\\n' \"$" + CONFIG_ENV + "\" > conf/config.yaml"
                + " && { cp \"$FLINK_HOME/conf/log4j-console.properties\" conf/ 2>/dev/null || true; }"
                + " && export FLINK_CONF_DIR=\"$PWD/conf\" FLINK_LOG_DIR=\"$PWD/log\""
                + " && exec \"$FLINK_HOME/bin/taskmanager.sh\" start-foreground"
                + flags
                + " "
                + memory;
    }

    /** The task's environment: FLINK_HOME and the TaskManager's configuration. */
    static Map<String, String> environment(Configuration config, String rpcAddress) {
        Map<String, String> env = new TreeMap<>();
        String flinkHome =
                config.getOptional(AgoraOptions.TASK_MANAGER_FLINK_HOME)
                        .orElseGet(() -> System.getenv().getOrDefault("FLINK_HOME", ""));
        if (flinkHome.isEmpty()) {
            throw new IllegalStateException(
                    "FLINK_HOME is not set and neither is agora.taskmanager.flink-home: "
                            + "the agents need to know where Flink is");
        }
        env.put("FLINK_HOME", flinkHome);
        env.put(CONFIG_ENV, String.join("\n", configLines(config, rpcAddress)));
        return env;
    }

    /**
     * The JobManager's configuration as a TaskManager's config.yaml: without what the task sets
     * itself (host, ports, resource id, directories) and without the JobManager's own
     * internals.
     */
    static List<String> configLines(Configuration config, String rpcAddress) {
        Configuration tm = new Configuration();
        for (Map.Entry<String, String> e : config.toMap().entrySet()) {
            String key = e.getKey();
            if (key.startsWith("$internal.")
                    || key.startsWith("agora.")
                    || key.startsWith("taskmanager.memory.")
                    || key.equals(TaskManagerOptions.HOST.key())
                    || key.equals(TaskManagerOptions.BIND_HOST.key())
                    || key.equals(TaskManagerOptions.RPC_PORT.key())
                    || key.equals(TaskManagerOptions.TASK_MANAGER_RESOURCE_ID.key())
                    || key.equals(NettyShuffleEnvironmentOptions.DATA_PORT.key())
                    || key.equals(CoreOptions.TMP_DIRS.key())
                    || key.equals("process.working-dir")
                    || key.equals("process.taskmanager.working-dir")
                    || key.equals("web.tmpdir")) {
                continue;
            }
            tm.setString(key, e.getValue());
        }
        tm.set(JobManagerOptions.ADDRESS, rpcAddress);
        return ConfigurationUtils.convertConfigToWritableLines(tm, false);
    }

    private static void flag(StringBuilder flags, String key, String value) {
        flags.append(" -D").append(key).append("=\"").append(escape(value)).append('"');
    }

    /** Escapes for a double-quoted shell word, leaving {@code $VAR} references alive. */
    static String escape(String value) {
        return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("`", "\\`");
    }

    private static String trim(double value) {
        if (value == Math.rint(value)) {
            return Long.toString((long) value);
        }
        return Double.toString(value);
    }
}
