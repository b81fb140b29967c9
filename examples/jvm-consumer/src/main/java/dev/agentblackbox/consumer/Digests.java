package dev.agentblackbox.consumer;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;

/**
 * The values an envelope's {@code input_digest} and {@code output_digest} were taken over,
 * rebuilt from its body as JSON text (docs/consuming-from-other-languages.md, "Digests").
 * The text need not be canonical: the digest is SHA-256 over its RFC 8785 form.
 */
final class Digests {
  private Digests() {}

  /** The input of an event of {@code type}; {@code request} is an llm.call's whole one. */
  static String input(String type, GenericRecord body, String request) {
    Map<String, String> in = new LinkedHashMap<>();
    switch (type) {
      case "run.started" -> {
        in.put("code_version", Json.quote(text(body, "code_version")));
        in.put("input", text(body, "input_json"));
        in.put("prompt_templates", pairs(body, "prompt_templates", "id", "digest"));
        in.put("tool_schemas", pairs(body, "tool_schemas", "name", "version"));
        in.put("model_ids", Json.strings(strings(body.get("model_ids"))));
        in.put("flags", stringMap(body.get("flags")));
        in.put("permissions", Json.strings(strings(body.get("permissions"))));
        in.put("parent_run_id", Json.stringOrNull(body.get("parent_run_id")));
        in.put("changes", stringMap(body.get("changes")));
      }
      case "llm.call" -> {
        in.put("provider", Json.quote(text(body, "provider")));
        in.put("model", Json.quote(text(body, "model")));
        in.put("request", request == null ? "null" : request);
      }
      case "tool.call" -> {
        return text(body, "arguments_json");
      }
      case "retrieval" -> {
        in.put("index", Json.quote(text(body, "index")));
        in.put("index_version", Json.quote(text(body, "index_version")));
        in.put("query", text(body, "query_json"));
        in.put("filters", Json.textOrNull(body.get("filters_json")));
        in.put("top_k", body.get("top_k") == null ? "null" : body.get("top_k").toString());
      }
      case "clock.read" -> in.put("clock", Json.quote(text(body, "clock")));
      case "random.draw" -> {
        in.put("kind", Json.quote(text(body, "kind")));
        String arguments = text(body, "arguments_json");
        in.put("arguments", arguments.equals("null") ? "{}" : arguments);
      }
      case "effect.intent" -> {
        in.put("effect", Json.quote(text(body, "effect")));
        in.put("idempotency_key", Json.quote(text(body, "idempotency_key")));
        in.put("arguments", text(body, "arguments_json"));
      }
      case "effect.receipt" -> {
        in.put("effect", Json.quote(text(body, "effect")));
        in.put("idempotency_key", Json.quote(text(body, "idempotency_key")));
      }
      case "state.transition" -> {
        in.put("from_state", Json.stringOrNull(body.get("from_state")));
        in.put("to_state", Json.quote(text(body, "to_state")));
        in.put("reason", Json.stringOrNull(body.get("reason")));
      }
      case "run.finished" -> in.put("status", Json.quote(text(body, "status")));
      case "run.redacted" -> {
        in.put("reason", Json.quote(text(body, "reason")));
        in.put("retention_class", Json.stringOrNull(body.get("retention_class")));
        in.put("subject_id", Json.stringOrNull(body.get("subject_id")));
      }
      default -> {
        return null;
      }
    }
    return Json.object(in);
  }

  /** The output of an event of {@code type}. */
  static String output(String type, GenericRecord body) {
    Map<String, String> out = new LinkedHashMap<>();
    switch (type) {
      case "llm.call" -> {
        Object response = body.get("raw_response_json");
        GenericRecord truncated = field(body, "body_truncated");
        if (response == null && truncated != null) {
          response = truncated.get("reduced_response_json");
        }
        out.put("response", Json.textOrNull(response));
        out.put("error", error(body));
      }
      case "tool.call" -> {
        out.put("result", Json.textOrNull(body.get("result_json")));
        out.put("error", error(body));
      }
      case "retrieval" -> {
        out.put("hits", Json.textOrNull(body.get("hits_json")));
        out.put("error", error(body));
      }
      case "clock.read" -> out.put("value_us", body.get("value_us").toString());
      case "random.draw" -> out.put("value", Json.textOrNull(body.get("value_json")));
      case "state.transition" -> out.put("state", Json.textOrNull(body.get("state_json")));
      case "effect.receipt" -> {
        out.put("status", Json.quote(text(body, "status")));
        out.put("external_id", Json.stringOrNull(body.get("external_id")));
        out.put("result", Json.textOrNull(body.get("result_json")));
        out.put("error", error(body));
      }
      case "run.finished" -> {
        out.put("output", Json.textOrNull(body.get("output_json")));
        out.put("error", error(body));
        out.put("final_state_digest", Json.stringOrNull(body.get("final_state_digest")));
      }
      case "run.redacted" -> out.put("key_ids", Json.strings(strings(body.get("key_ids"))));
      default -> {} // run.started, effect.intent: an empty object
    }
    return Json.object(out);
  }

  /** A recorded error: its fields that are not null, all strings; or null. */
  private static String error(GenericRecord body) {
    GenericRecord error = field(body, "error");
    if (error == null) {
      return "null";
    }
    Map<String, String> present = new LinkedHashMap<>();
    for (Schema.Field field : error.getSchema().getFields()) {
      Object value = error.get(field.name());
      if (value != null) {
        present.put(field.name(), Json.quote(value.toString()));
      }
    }
    return Json.object(present);
  }

  private static GenericRecord field(GenericRecord body, String name) {
    return body.getSchema().getField(name) == null ? null : (GenericRecord) body.get(name);
  }

  private static String text(GenericRecord body, String name) {
    Object value = body.get(name);
    return value == null ? "null" : value.toString();
  }

  private static List<String> strings(Object array) {
    List<String> items = new ArrayList<>();
    for (Object item : (List<?>) array) {
      items.add(item.toString());
    }
    return items;
  }

  private static String stringMap(Object map) {
    Map<String, String> members = new LinkedHashMap<>();
    ((Map<?, ?>) map).forEach((k, v) -> members.put(k.toString(), Json.quote(v.toString())));
    return Json.object(members);
  }

  private static String pairs(GenericRecord body, String name, String key, String value) {
    Map<String, String> members = new LinkedHashMap<>();
    for (Object item : (List<?>) body.get(name)) {
      GenericRecord pair = (GenericRecord) item;
      members.put(pair.get(key).toString(), Json.quote(pair.get(value).toString()));
    }
    return Json.object(members);
  }
}
