package agora.flink.jobs;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

/**
 * An unbounded job for the Flink-on-Agora tests: a rate-limited generator ({@code --rate} per
 * second, default 20), a keyed running count in state, checkpointed every {@code
 * --checkpoint-ms} (default 1000). It never finishes; it is cancelled, or its cluster is
 * stopped.
 */
public final class Forever {
    public static void main(String[] args) throws Exception {
        double rate = 20;
        long checkpointMs = 1000;
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--rate")) {
                rate = Double.parseDouble(args[i + 1]);
            } else if (args[i].equals("--checkpoint-ms")) {
                checkpointMs = Long.parseLong(args[i + 1]);
            } else {
                throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.enableCheckpointing(checkpointMs);
        DataGeneratorSource<Long> source =
                new DataGeneratorSource<>(
                        (GeneratorFunction<Long, Long>) n -> n,
                        Long.MAX_VALUE,
                        RateLimiterStrategy.perSecond(rate),
                        Types.LONG);
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "numbers")
                .keyBy(new Bucket())
                .process(new Count())
                .sinkTo(new DiscardingSink<>());
        env.execute("agora-forever");
    }

    /** n mod 8. */
    public static final class Bucket implements KeySelector<Long, Long> {
        @Override
        public Long getKey(Long n) {
            return n % 8;
        }
    }

    /** A running count per key, in keyed state. */
    public static final class Count extends KeyedProcessFunction<Long, Long, Long> {
        private transient ValueState<Long> count;

        @Override
        public void open(OpenContext context) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(Long n, Context context, Collector<Long> out) throws Exception {
            Long seen = count.value();
            long next = (seen == null ? 0 : seen) + 1;
            count.update(next);
            out.collect(next);
        }
    }
}
