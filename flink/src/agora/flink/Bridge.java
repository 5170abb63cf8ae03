package agora.flink;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * The {@code agora-flink-bridge} child process: JSON lines to its stdin, events from its stdout
 * handed to a listener on a reader thread, in order. Its stderr (its log) is the JobManager's.
 * The bridge exits when its stdin closes, so it never outlives the JobManager, even one killed
 * with SIGKILL.
 */
final class Bridge {
    private static final Logger LOG = LoggerFactory.getLogger(Bridge.class);
    static final ObjectMapper JSON = new ObjectMapper();

    private final Process process;
    private final OutputStream stdin;
    private final Thread reader;

    private Bridge(Process process, Consumer<JsonNode> onEvent, Runnable onClosed) {
        this.process = process;
        this.stdin = process.getOutputStream();
        this.reader =
                new Thread(
                        () -> read(onEvent, onClosed), "agora-flink-bridge-reader-" + process.pid());
        this.reader.setDaemon(true);
    }

    /** Starts {@code command}; {@code onEvent} gets each event, {@code onClosed} the end of stdout. */
    static Bridge start(List<String> command, Consumer<JsonNode> onEvent, Runnable onClosed)
            throws IOException {
        ProcessBuilder builder = new ProcessBuilder(command);
        builder.redirectError(ProcessBuilder.Redirect.INHERIT);
        builder.redirectInput(ProcessBuilder.Redirect.PIPE);
        builder.redirectOutput(ProcessBuilder.Redirect.PIPE);
        Process process = builder.start();
        LOG.info("Started agora-flink-bridge (pid {}): {}", process.pid(), command);
        Bridge bridge = new Bridge(process, onEvent, onClosed);
        bridge.reader.start();
        return bridge;
    }

    /** Sends one command; false if the bridge is gone. */
    synchronized boolean send(ObjectNode command) {
        try {
            byte[] line = (JSON.writeValueAsString(command) + "\n").getBytes(StandardCharsets.UTF_8);
            stdin.write(line);
            stdin.flush();
            return true;
        } catch (IOException e) {
            LOG.warn("Cannot send {} to agora-flink-bridge: {}", command.get("op"), e.toString());
            return false;
        }
    }

    /** Closes its stdin (the bridge terminates, keeping the workers) and waits for it to exit. */
    void close(long timeoutMillis) {
        synchronized (this) {
            try {
                stdin.close();
            } catch (IOException ignored) {
                // It is gone already.
            }
        }
        try {
            if (!process.waitFor(timeoutMillis, TimeUnit.MILLISECONDS)) {
                LOG.warn("agora-flink-bridge did not exit in {} ms; killing it", timeoutMillis);
                process.destroyForcibly();
                process.waitFor(timeoutMillis, TimeUnit.MILLISECONDS);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            process.destroyForcibly();
        }
    }

    boolean isAlive() {
        return process.isAlive();
    }

    private void read(Consumer<JsonNode> onEvent, Runnable onClosed) {
        try (BufferedReader lines =
                new BufferedReader(
                        new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = lines.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode event;
                try {
                    event = JSON.readTree(line);
                } catch (IOException e) {
                    LOG.error("agora-flink-bridge wrote a line that is not JSON: {}", line);
                    continue;
                }
                try {
                    onEvent.accept(event);
                } catch (RuntimeException e) {
                    LOG.error("Handling the bridge's event {} failed", line, e);
                }
            }
        } catch (IOException e) {
            LOG.warn("Reading agora-flink-bridge's events failed: {}", e.toString());
        } finally {
            onClosed.run();
        }
    }
}
