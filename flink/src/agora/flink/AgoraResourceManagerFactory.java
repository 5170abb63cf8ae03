package agora.flink;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.clusterframework.TaskExecutorProcessUtils;
import org.apache.flink.runtime.resourcemanager.ResourceManagerRuntimeServicesConfiguration;
import org.apache.flink.runtime.resourcemanager.WorkerResourceSpec;
import org.apache.flink.runtime.resourcemanager.WorkerResourceSpecFactory;
import org.apache.flink.runtime.resourcemanager.active.ActiveResourceManagerFactory;
import org.apache.flink.runtime.resourcemanager.active.ResourceManagerDriver;
import org.apache.flink.util.ConfigurationException;

/** The active resource manager of Flink on Agora: Flink's own, with {@link AgoraResourceManagerDriver}. */
public final class AgoraResourceManagerFactory
        extends ActiveResourceManagerFactory<AgoraWorkerNode> {
    public static final AgoraResourceManagerFactory INSTANCE = new AgoraResourceManagerFactory();

    private AgoraResourceManagerFactory() {}

    @Override
    protected ResourceManagerDriver<AgoraWorkerNode> createResourceManagerDriver(
            Configuration configuration, String webInterfaceUrl, String rpcAddress) {
        AgoraOptions.validate(configuration);
        return new AgoraResourceManagerDriver(configuration, rpcAddress, webInterfaceUrl);
    }

    @Override
    protected ResourceManagerRuntimeServicesConfiguration
            createResourceManagerRuntimeServicesConfiguration(Configuration configuration)
                    throws ConfigurationException {
        return ResourceManagerRuntimeServicesConfiguration.fromConfiguration(
                configuration, WorkerSpecs.INSTANCE);
    }

    /** TaskManager sizes from Flink's memory options and {@code agora.taskmanager.cpus}. */
    static final class WorkerSpecs extends WorkerResourceSpecFactory {
        static final WorkerSpecs INSTANCE = new WorkerSpecs();

        @Override
        public WorkerResourceSpec createDefaultWorkerResourceSpec(Configuration configuration) {
            double cpus = configuration.get(AgoraOptions.TASK_MANAGER_CPUS);
            return workerResourceSpecFromConfigAndCpu(
                    configuration, TaskExecutorProcessUtils.getCpuCoresWithFallback(configuration, cpus));
        }
    }
}
