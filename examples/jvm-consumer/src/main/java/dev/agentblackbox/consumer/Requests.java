package dev.agentblackbox.consumer;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.generic.GenericRecord;

/**
 * Rebuilds LLM requests stored by reference ({@code llm.call} v4, {@code request_prefix}):
 * the request of an earlier llm.call of the same run (at most 8 llm.calls back) supplies
 * the first {@code items} entries of the turn list {@code key} and the top-level
 * {@code fields} named; {@code raw_request_json} holds the rest.
 */
final class Requests {
  static final int WINDOW = 8;

  // Numbers kept as written: the canonicaliser reads them again as doubles.
  private static final ObjectMapper MAPPER =
      new ObjectMapper()
          .enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
          .enable(DeserializationFeature.USE_BIG_INTEGER_FOR_INTS);

  private final Map<String, LinkedHashMap<Long, JsonNode>> runs = new HashMap<>();

  /** A request as rebuilt, and the digest its body says it must have (or null). */
  record Rebuilt(String text, String expectedSha256) {}

  /** The whole request of an llm.call body, remembered for the calls after it. */
  Rebuilt read(String runId, long sequence, GenericRecord body) throws IOException {
    LinkedHashMap<Long, JsonNode> held = runs.computeIfAbsent(runId, id -> new LinkedHashMap<>());
    Object text = body.get("raw_request_json");
    GenericRecord prefix =
        body.getSchema().getField("request_prefix") == null
            ? null
            : (GenericRecord) body.get("request_prefix");
    if (prefix == null) {
      if (text != null) {
        hold(held, sequence, MAPPER.readTree(text.toString()));
      }
      return new Rebuilt(text == null ? null : text.toString(), null);
    }
    long earlierSequence = (Long) prefix.get("sequence");
    JsonNode earlier = held.get(earlierSequence);
    if (earlier == null) {
      throw new IOException(
          "run " + runId + " sequence " + sequence + " continues llm.call " + earlierSequence
              + ", not read before");
    }
    ObjectNode whole = ((ObjectNode) MAPPER.readTree(text.toString())).deepCopy();
    for (Object field : (List<?>) prefix.get("fields")) {
      whole.set(field.toString(), earlier.get(field.toString()));
    }
    String key = prefix.get("key").toString();
    if (!key.isEmpty()) {
      ArrayNode turns = MAPPER.createArrayNode();
      long shared = (Long) prefix.get("items");
      for (int i = 0; i < shared; i++) {
        turns.add(earlier.get(key).get(i));
      }
      whole.get(key).forEach(turns::add);
      whole.set(key, turns);
    }
    hold(held, sequence, whole);
    return new Rebuilt(MAPPER.writeValueAsString(whole), prefix.get("request_sha256").toString());
  }

  private static void hold(LinkedHashMap<Long, JsonNode> held, long sequence, JsonNode request) {
    held.put(sequence, request);
    while (held.size() > WINDOW) {
      held.remove(held.keySet().iterator().next());
    }
  }
}
