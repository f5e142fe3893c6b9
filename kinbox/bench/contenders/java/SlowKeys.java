package dev.kinbox.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelEoSStreamProcessor;
import java.io.StringReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The slow-keys benchmark's parallel-consumer contender: Confluent's parallel-consumer in KEY
 * order, each record applied in a PostgreSQL transaction of its own (a wait, then one effect
 * row) on one of maxConcurrency JDBC connections. At least once: the offsets are committed by
 * parallel-consumer after the records are done, with its default periodic commits.
 *
 * <p>Configured by environment variables (SLOWKEYS_*, set by kinbox.bench); runs until SIGTERM,
 * then closes the consumer (committing what is done) and exits 0.
 */
public final class SlowKeys {
  private static final Pattern FIELD =
      Pattern.compile("\"(\\w+)\"\\s*:\\s*(?:\"((?:[^\"\\\\]|\\\\.)*)\"|([-+0-9.eE]+))");

  /** One pooled connection with its two prepared statements. */
  private static final class Lane {
    final Connection conn;
    final PreparedStatement wait;
    final PreparedStatement insert;

    Lane(String url, Properties props, String waitSql, String insertSql) throws SQLException {
      conn = DriverManager.getConnection(url, props);
      conn.setAutoCommit(false);
      wait = conn.prepareStatement(waitSql);
      insert = conn.prepareStatement(insertSql);
    }
  }

  private SlowKeys() {}

  private static String env(String name) {
    String value = System.getenv(name);
    if (value == null) {
      throw new IllegalStateException(name + " is not set");
    }
    return value;
  }

  public static void main(String[] args) throws Exception {
    int concurrency = Integer.parseInt(env("SLOWKEYS_CONCURRENCY"));
    long expected = Long.parseLong(env("SLOWKEYS_EXPECTED"));
    double sleep = Double.parseDouble(env("SLOWKEYS_SLEEP_S"));
    String topic = env("SLOWKEYS_TOPIC");

    Properties db = new Properties();
    db.setProperty("user", env("SLOWKEYS_DB_USER"));
    String password = System.getenv("SLOWKEYS_DB_PASSWORD");
    if (password != null) {
      db.setProperty("password", password);
    }
    BlockingQueue<Lane> pool = new ArrayBlockingQueue<>(concurrency);
    for (int i = 0; i < concurrency; i++) {
      pool.add(new Lane(env("SLOWKEYS_JDBC_URL"), db, "SELECT pg_sleep(?)",
          env("SLOWKEYS_INSERT")));
    }

    Properties kafka = new Properties();
    String extra = System.getenv("SLOWKEYS_KAFKA");
    if (extra != null) {
      kafka.load(new StringReader(extra));
    }
    kafka.setProperty("bootstrap.servers", env("SLOWKEYS_BOOTSTRAP"));
    kafka.setProperty("group.id", env("SLOWKEYS_GROUP"));
    kafka.setProperty("enable.auto.commit", "false");
    kafka.setProperty("auto.offset.reset", "earliest");
    KafkaConsumer<byte[], byte[]> consumer =
        new KafkaConsumer<>(kafka, new ByteArrayDeserializer(), new ByteArrayDeserializer());

    ParallelConsumerOptions<byte[], byte[]> options =
        ParallelConsumerOptions.<byte[], byte[]>builder()
            .ordering(ProcessingOrder.KEY)
            .maxConcurrency(concurrency)
            .consumer(consumer)
            .build();
    ParallelEoSStreamProcessor<byte[], byte[]> pc = new ParallelEoSStreamProcessor<>(options);
    pc.subscribe(List.of(topic));

    AtomicLong done = new AtomicLong();
    AtomicLong firstAt = new AtomicLong();
    pc.poll(context -> {
      ConsumerRecord<byte[], byte[]> record = context.getSingleConsumerRecord();
      Lane lane;
      try {
        lane = pool.take();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException(e);
      }
      try {
        apply(lane, record, sleep);
      } finally {
        pool.add(lane);
      }
      firstAt.compareAndSet(0, System.nanoTime());
      if (done.incrementAndGet() == expected) {
        double seconds = (System.nanoTime() - firstAt.get()) / 1e9;
        System.out.printf("processed %d records in %.2f s (%.0f/s, first to last)%n",
            expected, seconds, (expected - 1) / seconds);
        System.out.flush();
      }
    });

    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      pc.close();
      for (Lane lane : pool) {
        try {
          lane.conn.close();
        } catch (SQLException ignored) {
          // closing at exit: nothing left to do with it
        }
      }
      System.out.println("closed after " + done.get() + " records");
      System.out.flush();
      Runtime.getRuntime().halt(0);
    }));
    while (!pc.isClosedOrFailed()) {
      Thread.sleep(200);
    }
    Exception cause = pc.getFailureCause();
    if (cause == null) {
      // Closed by the shutdown hook (SIGTERM), which exits 0 once it is done.
      Thread.sleep(Long.MAX_VALUE);
    }
    System.err.println("parallel-consumer stopped: " + cause);
    cause.printStackTrace();
    Runtime.getRuntime().halt(1);
  }

  /** The record's work in one transaction: the wait, then its effect row. */
  private static void apply(Lane lane, ConsumerRecord<byte[], byte[]> record, double sleep) {
    String id = null;
    for (Header header : record.headers()) {
      if (header.key().equals("event-id") && header.value() != null) {
        id = new String(header.value(), StandardCharsets.UTF_8);
      }
    }
    if (id == null) {
      throw new IllegalStateException("record without an event-id header at " + record.offset());
    }
    String userId = null;
    String lessonId = null;
    double sentAt = 0;
    Matcher m = FIELD.matcher(new String(record.value(), StandardCharsets.UTF_8));
    while (m.find()) {
      switch (m.group(1)) {
        case "userId" -> userId = m.group(2);
        case "lessonId" -> lessonId = m.group(2);
        case "sentAt" -> sentAt = Double.parseDouble(m.group(3));
        default -> { }
      }
    }
    try {
      lane.wait.setDouble(1, sleep);
      lane.wait.execute();
      lane.insert.setString(1, id);
      lane.insert.setInt(2, record.partition());
      lane.insert.setLong(3, record.offset());
      lane.insert.setString(4, userId);
      lane.insert.setString(5, lessonId);
      lane.insert.setDouble(6, sentAt);
      lane.insert.executeUpdate();
      lane.conn.commit();
    } catch (SQLException e) {
      try {
        lane.conn.rollback();
      } catch (SQLException ignored) {
        // the connection is gone: the record is retried on whatever it says next
      }
      throw new IllegalStateException("applying offset " + record.offset() + ": " + e, e);
    }
  }
}
