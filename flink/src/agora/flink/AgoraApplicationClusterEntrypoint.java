package agora.flink;

import org.apache.flink.client.deployment.application.ApplicationClusterEntryPoint;
import org.apache.flink.client.program.DefaultPackagedProgramRetriever;
import org.apache.flink.client.program.PackagedProgram;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.PipelineOptions;
import org.apache.flink.runtime.entrypoint.ClusterEntrypoint;
import org.apache.flink.runtime.entrypoint.ClusterEntrypointUtils;
import org.apache.flink.runtime.entrypoint.EntrypointClusterConfiguration;
import org.apache.flink.runtime.entrypoint.EntrypointClusterConfigurationParserFactory;
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.apache.flink.runtime.util.JvmShutdownSafeguard;
import org.apache.flink.runtime.util.SignalHandler;

import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;

/**
 * A Flink application cluster on Agora: a JobManager that runs one application's main method,
 * gets its TaskManagers from Agora, and when the application ends deregisters (every
 * TaskManager ends) and exits.
 *
 * <pre>
 * flink/bin/agora-application.sh --configDir DIR --jar JOB.jar [--class MAIN] [-Dkey=value ...] [-- ARGS ...]
 * </pre>
 */
public final class AgoraApplicationClusterEntrypoint extends ApplicationClusterEntryPoint {

    private AgoraApplicationClusterEntrypoint(Configuration configuration, PackagedProgram program) {
        super(configuration, program, AgoraResourceManagerFactory.INSTANCE);
    }

    public static void main(String[] args) {
        EnvironmentInformation.logEnvironmentInfo(
                LOG, AgoraApplicationClusterEntrypoint.class.getSimpleName(), args);
        SignalHandler.register(LOG);
        JvmShutdownSafeguard.installAsShutdownHook(LOG);

        String jar = null;
        String mainClass = null;
        List<String> entrypointArgs = new ArrayList<>();
        List<String> programArgs = Collections.emptyList();
        for (int i = 0; i < args.length; i++) {
            String arg = args[i];
            if (arg.equals("--")) {
                programArgs = Arrays.asList(args).subList(i + 1, args.length);
                break;
            } else if ((arg.equals("--jar") || arg.equals("--class")) && i + 1 < args.length) {
                if (arg.equals("--jar")) {
                    jar = args[++i];
                } else {
                    mainClass = args[++i];
                }
            } else {
                entrypointArgs.add(arg);
            }
        }
        if (jar == null) {
            LOG.error("agora-application: --jar JOB.jar is required");
            System.exit(STARTUP_FAILURE_RETURN_CODE);
        }
        EntrypointClusterConfiguration clusterConfiguration =
                ClusterEntrypointUtils.parseParametersOrExit(
                        entrypointArgs.toArray(new String[0]),
                        new EntrypointClusterConfigurationParserFactory(),
                        AgoraApplicationClusterEntrypoint.class);
        Configuration configuration = loadConfiguration(clusterConfiguration);
        AgoraOptions.validate(configuration);
        File jarFile = new File(jar).getAbsoluteFile();
        configuration.set(
                PipelineOptions.JARS, Collections.singletonList(jarFile.toURI().toString()));

        PackagedProgram program;
        try {
            program =
                    DefaultPackagedProgramRetriever.create(
                                    null,
                                    jarFile,
                                    mainClass,
                                    programArgs.toArray(new String[0]),
                                    configuration)
                            .getPackagedProgram();
            configureExecution(configuration, program);
        } catch (Exception e) {
            LOG.error("Could not load the application {} from {}", mainClass, jarFile, e);
            System.exit(STARTUP_FAILURE_RETURN_CODE);
            return;
        }
        ClusterEntrypoint.runClusterEntrypoint(
                new AgoraApplicationClusterEntrypoint(configuration, program));
    }
}
