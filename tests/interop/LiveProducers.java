import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Two of Kafka's own producers driven line by line from standard input (a test's script): an
 * idempotent one ("idem", gzip) and a transactional one ("txn", zstd, also idempotent).
 *
 * <p>Lines, tab-separated: {@code send PRODUCER TOPIC KEY VALUE HEADERS} (HEADERS {@code k:v,k:v}
 * or empty; a KEY or VALUE of {@code <null>} is null), {@code begin}, {@code commit}, {@code abort}
 * (the transactional producer's transaction), {@code sync} (flush both, then print {@code synced}
 * once every record sent is acknowledged). A send the broker refused ends the program with exit 1
 * and the error on standard error.
 */
public final class LiveProducers {
    private static final String NULL = "<null>";

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String transactionalId = args[1];
        AtomicReference<Exception> failed = new AtomicReference<>();
        try (KafkaProducer<byte[], byte[]> idem = producer(bootstrap, "gzip", null);
                KafkaProducer<byte[], byte[]> txn = producer(bootstrap, "zstd", transactionalId)) {
            txn.initTransactions();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                String[] f = line.split("\t", -1);
                switch (f[0]) {
                    case "send" -> {
                        KafkaProducer<byte[], byte[]> p = f[1].equals("txn") ? txn : idem;
                        ProducerRecord<byte[], byte[]> record =
                                new ProducerRecord<>(f[2], 0, null, bytes(f[3]), bytes(f[4]), headers(f[5]));
                        p.send(record, (metadata, error) -> {
                            if (error != null) {
                                failed.compareAndSet(null, error);
                            }
                        });
                    }
                    case "begin" -> txn.beginTransaction();
                    case "commit" -> txn.commitTransaction();
                    case "abort" -> txn.abortTransaction();
                    case "sync" -> {
                        idem.flush();
                        txn.flush();
                        if (failed.get() != null) {
                            throw failed.get();
                        }
                        System.out.println("synced");
                        System.out.flush();
                    }
                    default -> throw new IllegalArgumentException("unknown line: " + line);
                }
            }
        }
        if (failed.get() != null) {
            throw failed.get();
        }
    }

    private static KafkaProducer<byte[], byte[]> producer(String bootstrap, String codec, String transactionalId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("compression.type", codec);
        p.put("linger.ms", "5");
        p.put("batch.size", "1024"); // (under the topics' small segments)
        if (transactionalId != null) {
            p.put("transactional.id", transactionalId);
        }
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    private static byte[] bytes(String text) {
        return text.equals(NULL) ? null : text.getBytes(StandardCharsets.UTF_8);
    }

    private static List<Header> headers(String text) {
        List<Header> headers = new ArrayList<>();
        for (String pair : text.isEmpty() ? new String[0] : text.split(",")) {
            String[] kv = pair.split(":", 2);
            headers.add(new RecordHeader(kv[0], bytes(kv[1])));
        }
        return headers;
    }
}
