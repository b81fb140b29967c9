package dev.agentblackbox.consumer;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.StringJoiner;
import org.erdtman.jcs.NumberToJSON;

/**
 * What an envelope's chain hash covers: the canonical JSON of the envelope without
 * {@code chain_hash}, its payload as {@code sha256:<hex>} of the bytes and its time as
 * integer microseconds. chain_hash = hex(SHA-256(bytes of the previous chain hash, from
 * hex; 32 zero bytes before the first event) followed by this material).
 */
final class ChainMaterial {
  private ChainMaterial() {}

  private static final long SAFE = 1L << 53;

  /** The material of {@code envelope} under its canonicalisation ({@code v1} or RFC 8785). */
  static String of(Envelope envelope) throws IOException {
    boolean rfc8785 = envelope.canonicalisation().equals("rfc8785");
    byte[] payload = envelope.payload();
    String[][] members = {
      {"agent_id", Json.quote(envelope.text("agent_id"))},
      {"attributes", attributes(envelope.attributes(), rfc8785)},
      {"body_version", number(envelope.bodyVersion(), rfc8785)},
      {"classification", Json.quote(envelope.text("classification"))},
      {"event_id", Json.quote(envelope.text("event_id"))},
      {"event_type", Json.quote(envelope.eventType())},
      {"input_digest", Json.quote(envelope.text("input_digest"))},
      {"key_id", Json.stringOrNull(envelope.text("key_id"))},
      {"output_digest", Json.quote(envelope.text("output_digest"))},
      {"parent_span_id", Json.stringOrNull(envelope.text("parent_span_id"))},
      {"payload", payload == null ? "null" : Json.quote(Json.sha256(payload))},
      {"payload_encoding", Json.quote(envelope.text("payload_encoding"))},
      {"payload_ref", Json.stringOrNull(envelope.text("payload_ref"))},
      {"recorded_at", number(envelope.recordedAtMicros(), rfc8785)},
      {"retention_class", Json.quote(envelope.text("retention_class"))},
      {"run_id", Json.quote(envelope.runId())},
      {"sequence", number(envelope.sequence(), rfc8785)},
      {"span_id", Json.stringOrNull(envelope.text("span_id"))},
      {"subject_ids", Json.strings(envelope.subjectIds())},
      {"tenant_id", Json.quote(envelope.text("tenant_id"))},
      {"trace_id", Json.stringOrNull(envelope.text("trace_id"))},
    };
    StringJoiner out = new StringJoiner(",", "{", "}");
    for (String[] member : members) {
      out.add(Json.quote(member[0]) + ":" + member[1]);
    }
    return out.toString();
  }

  /**
   * The attributes, keys sorted by UTF-16 code units (RFC 8785; Java's String order) or
   * by code point (version 1). The two differ only for keys holding characters from
   * U+E000 up against characters beyond U+FFFF.
   */
  private static String attributes(Map<String, String> attributes, boolean rfc8785) {
    List<String> names = new ArrayList<>(attributes.keySet());
    names.sort(rfc8785 ? Comparator.naturalOrder() : ChainMaterial::byCodePoint);
    StringJoiner out = new StringJoiner(",", "{", "}");
    for (String name : names) {
      out.add(Json.quote(name) + ":" + Json.quote(attributes.get(name)));
    }
    return out.toString();
  }

  private static int byCodePoint(String a, String b) {
    return java.util.Arrays.compare(a.codePoints().toArray(), b.codePoints().toArray());
  }

  /** An integer: its digits, or under RFC 8785 past 2**53 the double it reads as. */
  private static String number(long value, boolean rfc8785) throws IOException {
    if (!rfc8785 || (value <= SAFE && value >= -SAFE)) {
      return Long.toString(value);
    }
    return NumberToJSON.serializeNumber((double) value);
  }
}
