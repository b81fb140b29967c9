package dev.agentblackbox.consumer;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.StringJoiner;
import org.erdtman.jcs.JsonCanonicalizer;

/** JSON text as the contract writes it, and the SHA-256 digests taken over it. */
final class Json {
  private Json() {}

  /** {@code text} as a JSON string, escaped as RFC 8785 (and the recorder) escapes it. */
  static String quote(String text) {
    StringBuilder out = new StringBuilder(text.length() + 2).append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\b' -> out.append("\\b");
        case '\t' -> out.append("\\t");
        case '\n' -> out.append("\\n");
        case '\f' -> out.append("\\f");
        case '\r' -> out.append("\\r");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    return out.append('"').toString();
  }

  /** A JSON string, or {@code null}. */
  static String stringOrNull(Object value) {
    return value == null ? "null" : quote(value.toString());
  }

  /** A JSON text stored in a body, or {@code null} where the field is empty. */
  static String textOrNull(Object value) {
    return value == null ? "null" : value.toString();
  }

  /** An object of already written JSON values, in the given order (JCS sorts them). */
  static String object(Map<String, String> members) {
    StringJoiner out = new StringJoiner(",", "{", "}");
    members.forEach((name, value) -> out.add(quote(name) + ":" + value));
    return out.toString();
  }

  /** An array of strings. */
  static String strings(List<String> items) {
    StringJoiner out = new StringJoiner(",", "[", "]");
    items.forEach(item -> out.add(quote(item)));
    return out.toString();
  }

  /** The RFC 8785 canonical form of a JSON text, by an implementation of its own. */
  static byte[] canonical(String text) throws IOException {
    return new JsonCanonicalizer(text).getEncodedUTF8();
  }

  /** {@code sha256:<hex>} of bytes, as digests and the chain's payload are written. */
  static String sha256(byte[] data) {
    return "sha256:" + HexFormat.of().formatHex(sha256Bytes(data));
  }

  static byte[] sha256Bytes(byte[] data) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(data);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every JVM has SHA-256", e);
    }
  }

  static byte[] utf8(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }
}
