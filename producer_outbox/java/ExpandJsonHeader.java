/*
 * kinbox's one Kafka Connect transformation: turn the outbox row's `headers` column into
 * one Kafka header per entry.
 *
 * Debezium's Outbox Event Router can place a column in a header, but only as one header
 * holding the column's whole value; Kafka Connect's own transformations (HeaderFrom,
 * InsertHeader) take header names from the connector configuration. The outbox stores
 * headers as a jsonb object whose names vary per row, so neither can publish them the way
 * the relay does. This transformation runs after the router: it reads the JSON object the
 * router put in one header, adds each entry as a text header, and removes the carrier.
 *
 * Built by kinbox (`kinbox outbox connect-plugin`, and `kinbox dev --cdc` for itself) with
 * javac against the Connect API; Jackson comes from the Connect worker's own classpath.
 */
package dev.kinbox.connect;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.errors.DataException;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.header.Headers;
import org.apache.kafka.connect.transforms.Transformation;

/** Replace a header holding a JSON object of text values with one header per entry. */
public final class ExpandJsonHeader<R extends ConnectRecord<R>> implements Transformation<R> {

    /** The name of the header that carries the JSON object. */
    public static final String HEADER_CONFIG = "header";

    /** Headers removed from the record when their value is null (an empty column). */
    public static final String DROP_NULL_CONFIG = "drop.null";

    private static final ConfigDef CONFIG_DEF = new ConfigDef()
            .define(HEADER_CONFIG, ConfigDef.Type.STRING, "kinbox.headers",
                    ConfigDef.Importance.HIGH,
                    "Header holding a JSON object of text values; each entry becomes a header"
                            + " of its own and this header is removed.")
            .define(DROP_NULL_CONFIG, ConfigDef.Type.LIST, "", ConfigDef.Importance.MEDIUM,
                    "Headers to remove when their value is null, as the relay never sends"
                            + " a header for an empty column.");

    private static final ObjectMapper MAPPER = new ObjectMapper();

    private String carrier;
    private List<String> dropNull;

    @Override
    public void configure(Map<String, ?> props) {
        AbstractConfig config = new AbstractConfig(CONFIG_DEF, props);
        carrier = config.getString(HEADER_CONFIG);
        dropNull = config.getList(DROP_NULL_CONFIG);
    }

    @Override
    public R apply(R record) {
        Header source = record.headers().lastWithName(carrier);
        if (source == null) {
            return record; // not an outbox record (a heartbeat, say): leave it alone
        }
        Headers headers = record.headers().duplicate();
        headers.remove(carrier);
        for (String name : dropNull) {
            Header header = headers.lastWithName(name);
            if (header != null && header.value() == null) {
                headers.remove(name);
            }
        }
        if (source.value() != null) {
            for (Map.Entry<String, JsonNode> entry : parse(source.value(), record).properties()) {
                JsonNode value = entry.getValue();
                if (!value.isTextual()) {
                    throw new DataException("header " + entry.getKey() + " of the outbox record for "
                            + record.topic() + " is not text: " + value);
                }
                headers.addString(entry.getKey(), value.textValue());
            }
        }
        return record.newRecord(record.topic(), record.kafkaPartition(), record.keySchema(),
                record.key(), record.valueSchema(), record.value(), record.timestamp(), headers);
    }

    private JsonNode parse(Object value, R record) {
        JsonNode node;
        try {
            node = MAPPER.readTree(value.toString());
        } catch (Exception exc) {
            throw new DataException("header " + carrier + " of the outbox record for "
                    + record.topic() + " is not JSON", exc);
        }
        if (!node.isObject()) {
            throw new DataException("header " + carrier + " of the outbox record for "
                    + record.topic() + " is not a JSON object: " + node);
        }
        return node;
    }

    @Override
    public ConfigDef config() {
        return CONFIG_DEF;
    }

    @Override
    public void close() {
    }
}
