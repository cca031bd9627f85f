// The topics test_spark_sources_agree.py reads through both sources, written by Kafka's own Java
// client (run as a single-file program: `java -cp KAFKA_CLASSPATH SparkSourcesData.java
// BOOTSTRAP T0`). Timestamps are given (T0 + seconds), so that the test can name them; the
// topics are created by the test beforehand with their configs.
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class SparkSourcesData {
    static byte[] bytes(String text) {
        return text == null ? null : text.getBytes(StandardCharsets.UTF_8);
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String codec, String transactionalId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("compression.type", codec);
        p.put("linger.ms", "1000"); // batches end at each flush(), not by the clock
        p.put("batch.size", "2048"); // (under the topics' small segments)
        if (transactionalId != null) {
            p.put("transactional.id", transactionalId);
        }
        return new KafkaProducer<>(p);
    }

    static ProducerRecord<byte[], byte[]> record(String topic, int partition, long timestamp, int i) {
        String key = i % 11 == 0 ? null : "key-" + (i % 9);
        String value = i % 29 == 7 ? null : topic + "-" + partition + "-value-" + i + "-" + "x".repeat(i % 40);
        RecordHeaders headers = new RecordHeaders();
        if (i % 3 == 1) { // a repeated key, an empty value and a null one
            headers.add(new RecordHeader("h1", bytes(Integer.toString(i))));
            headers.add(new RecordHeader("h2", new byte[0]));
            headers.add(new RecordHeader("h1", bytes("again")));
            headers.add(new RecordHeader("none", null));
        }
        return new ProducerRecord<>(topic, partition, timestamp, bytes(key), bytes(value), headers);
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        long t0 = Long.parseLong(args[1]);
        try (KafkaProducer<byte[], byte[]> plain = producer(bootstrap, "none", null);
                KafkaProducer<byte[], byte[]> zstd = producer(bootstrap, "zstd", null)) {
            // sk-alpha: 3 partitions of small segments, batches of 10 in turn uncompressed and
            // zstd, timestamps that do not rise with offsets (and repeat).
            for (int i = 0; i < 150; i++) {
                for (int partition = 0; partition < 3; partition++) {
                    long timestamp = t0 + 1000L * ((i * 37 + partition * 11) % 300);
                    ((i / 10) % 2 == 0 ? plain : zstd).send(record("sk-alpha", partition, timestamp, i));
                }
                if (i % 10 == 9) {
                    plain.flush();
                    zstd.flush();
                }
            }
            // sk-beta: one partition, a record each 500 ms of timestamps, batches of 10.
            for (int i = 0; i < 100; i++) {
                plain.send(record("sk-beta", 0, t0 + 500L * i, i));
                if (i % 10 == 9) {
                    plain.flush();
                }
            }
            // sk-gamma: LogAppendTime (the broker's clock replaces the timestamps given).
            for (int i = 0; i < 40; i++) {
                plain.send(record("sk-gamma", i % 2, t0, i));
                if (i % 8 == 7) {
                    plain.flush();
                }
            }
            // sk-retained: small segments the broker deletes under retention.bytes.
            for (int i = 0; i < 200; i++) {
                plain.send(record("sk-retained", 0, t0 + 100L * i, i));
                if (i % 10 == 9) {
                    plain.flush();
                }
            }
            plain.flush();
            // sk-txn: transactions committed and aborted, and a plain producer's records between.
            try (KafkaProducer<byte[], byte[]> txn = producer(bootstrap, "none", "sk-txn-producer")) {
                txn.initTransactions();
                int i = 0;
                for (String outcome : List.of("commit", "abort", "commit", "abort", "commit")) {
                    txn.beginTransaction();
                    for (int k = 0; k < 6; k++, i++) {
                        txn.send(record("sk-txn", i % 2, t0 + 1000L * i, i));
                        if (k == 2) {
                            txn.flush();
                            plain.send(record("sk-txn", i % 2, t0 + 1000L * i + 1, 1000 + i));
                            plain.flush();
                        }
                    }
                    txn.flush();
                    if (outcome.equals("commit")) {
                        txn.commitTransaction();
                    } else {
                        txn.abortTransaction();
                    }
                }
            }
        }
    }
}
