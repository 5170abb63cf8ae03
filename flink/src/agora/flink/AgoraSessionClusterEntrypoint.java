package agora.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.entrypoint.ClusterEntrypoint;
import org.apache.flink.runtime.entrypoint.ClusterEntrypointUtils;
import org.apache.flink.runtime.entrypoint.EntrypointClusterConfiguration;
import org.apache.flink.runtime.entrypoint.EntrypointClusterConfigurationParserFactory;
import org.apache.flink.runtime.entrypoint.SessionClusterEntrypoint;
import org.apache.flink.runtime.entrypoint.component.DefaultDispatcherResourceManagerComponentFactory;
import org.apache.flink.runtime.entrypoint.component.DispatcherResourceManagerComponentFactory;
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.apache.flink.runtime.util.JvmShutdownSafeguard;
import org.apache.flink.runtime.util.SignalHandler;

/**
 * A Flink session cluster on Agora: a JobManager whose TaskManagers are Agora tasks, started on
 * demand. Run by {@code flink/bin/agora-session.sh --configDir DIR [-Dkey=value ...]}.
 */
public class AgoraSessionClusterEntrypoint extends SessionClusterEntrypoint {

    public AgoraSessionClusterEntrypoint(Configuration configuration) {
        super(configuration);
    }

    @Override
    protected DispatcherResourceManagerComponentFactory
            createDispatcherResourceManagerComponentFactory(Configuration configuration) {
        return DefaultDispatcherResourceManagerComponentFactory.createSessionComponentFactory(
                AgoraResourceManagerFactory.INSTANCE);
    }

    public static void main(String[] args) {
        EnvironmentInformation.logEnvironmentInfo(
                LOG, AgoraSessionClusterEntrypoint.class.getSimpleName(), args);
        SignalHandler.register(LOG);
        JvmShutdownSafeguard.installAsShutdownHook(LOG);
        EntrypointClusterConfiguration clusterConfiguration =
                ClusterEntrypointUtils.parseParametersOrExit(
                        args,
                        new EntrypointClusterConfigurationParserFactory(),
                        AgoraSessionClusterEntrypoint.class);
        Configuration configuration = loadConfiguration(clusterConfiguration);
        AgoraOptions.validate(configuration);
        ClusterEntrypoint.runClusterEntrypoint(new AgoraSessionClusterEntrypoint(configuration));
    }
}
