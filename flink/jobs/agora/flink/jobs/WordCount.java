package agora.flink.jobs;

import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.functions.FlatMapFunction;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.util.CloseableIterator;
import org.apache.flink.util.Collector;

import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * A bounded word count for the Flink-on-Agora tests (pipelined, so every subtask holds a slot at
 * once; {@code --mode batch} for Flink's batch mode): counts the words of {@code
 * --lines N} generated lines ("line i" has the words {@code w(i mod 7)}, {@code w(i mod 3)} and
 * {@code agora}) and writes {@code word count} lines, sorted, to {@code --output FILE} (and
 * stdout).
 */
public final class WordCount {
    public static void main(String[] args) throws Exception {
        int lines = 1000;
        String output = null;
        RuntimeExecutionMode mode = RuntimeExecutionMode.STREAMING;
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--lines")) {
                lines = Integer.parseInt(args[i + 1]);
            } else if (args[i].equals("--mode")) {
                mode = RuntimeExecutionMode.valueOf(args[i + 1].toUpperCase(java.util.Locale.ROOT));
            } else if (args[i].equals("--output")) {
                output = args[i + 1];
            } else {
                throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        List<String> text = new ArrayList<>();
        for (int i = 0; i < lines; i++) {
            text.add("w" + (i % 7) + " w" + (i % 3) + " agora");
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setRuntimeMode(mode);
        Map<String, Integer> counts = new TreeMap<>();
        try (CloseableIterator<Tuple2<String, Integer>> result =
                env.fromData(text)
                        .flatMap(new Split())
                        .keyBy(new Word())
                        .sum(1)
                        .executeAndCollect("agora-wordcount")) {
            while (result.hasNext()) {
                Tuple2<String, Integer> count = result.next();
                counts.put(count.f0, count.f1);
            }
        }
        StringBuilder out = new StringBuilder();
        counts.forEach((word, count) -> out.append(word).append(' ').append(count).append('\n'));
        System.out.print(out);
        if (output != null) {
            Files.write(Paths.get(output), out.toString().getBytes(StandardCharsets.UTF_8));
        }
    }

    /** Splits a line into (word, 1). */
    public static final class Split implements FlatMapFunction<String, Tuple2<String, Integer>> {
        @Override
        public void flatMap(String line, Collector<Tuple2<String, Integer>> out) {
            for (String word : line.split("\\s+")) {
                if (!word.isEmpty()) {
                    out.collect(Tuple2.of(word, 1));
                }
            }
        }
    }

    /** The word. */
    public static final class Word implements KeySelector<Tuple2<String, Integer>, String> {
        @Override
        public String getKey(Tuple2<String, Integer> value) {
            return value.f0;
        }
    }
}
