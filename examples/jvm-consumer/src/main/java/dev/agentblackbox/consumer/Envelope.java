package dev.agentblackbox.consumer;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.generic.GenericRecord;

/** One envelope as Avro's generic reader gives it, read field by field. */
record Envelope(GenericRecord record) {

  /** The attribute that names the canonicalisation of a run's digests and chain. */
  static final String C14N = "c14n";

  String text(String field) {
    Object value = record.get(field);
    return value == null ? null : value.toString();
  }

  String runId() {
    return text("run_id");
  }

  String eventType() {
    return text("event_type");
  }

  long sequence() {
    return (Long) record.get("sequence");
  }

  int bodyVersion() {
    return (Integer) record.get("body_version");
  }

  /** Microseconds since 1970 (timestamp-micros, read without its logical type). */
  long recordedAtMicros() {
    return (Long) record.get("recorded_at");
  }

  byte[] payload() {
    ByteBuffer buffer = (ByteBuffer) record.get("payload");
    if (buffer == null) {
      return null;
    }
    byte[] bytes = new byte[buffer.remaining()];
    buffer.duplicate().get(bytes);
    return bytes;
  }

  List<String> subjectIds() {
    List<String> ids = new ArrayList<>();
    for (Object id : (List<?>) record.get("subject_ids")) {
      ids.add(id.toString());
    }
    return ids;
  }

  Map<String, String> attributes() {
    Map<String, String> attributes = new LinkedHashMap<>();
    ((Map<?, ?>) record.get("attributes"))
        .forEach((name, value) -> attributes.put(name.toString(), value.toString()));
    return attributes;
  }

  /** {@code rfc8785}, or {@code v1} when the envelope names none. */
  String canonicalisation() {
    return attributes().getOrDefault(C14N, "v1");
  }
}
