package dev.agentblackbox.consumer;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.avro.Schema;
import org.apache.avro.SchemaCompatibility;
import org.apache.avro.SchemaCompatibility.SchemaCompatibilityType;

/** Apache Avro's own check: every newer body version reads data of every older one. */
final class Compatibility {
  private Compatibility() {}

  private static final Pattern KEY = Pattern.compile("(.+)\\.v(\\d+)");

  /** Problems found, one line each; {@code checked[0]} counts the pairs checked. */
  static List<String> check(Map<String, Schema> bodies, int[] checked) {
    Map<String, TreeMap<Integer, Schema>> byType = new TreeMap<>();
    bodies.forEach((key, schema) -> {
      Matcher name = KEY.matcher(key);
      if (name.matches()) {
        byType.computeIfAbsent(name.group(1), t -> new TreeMap<>())
            .put(Integer.parseInt(name.group(2)), schema);
      }
    });
    List<String> problems = new ArrayList<>();
    byType.forEach((type, versions) -> {
      for (var older : versions.entrySet()) {
        for (var newer : versions.tailMap(older.getKey(), false).entrySet()) {
          checked[0]++;
          var result = SchemaCompatibility.checkReaderWriterCompatibility(
              newer.getValue(), older.getValue());
          if (result.getType() != SchemaCompatibilityType.COMPATIBLE) {
            problems.add(type + " v" + newer.getKey() + " cannot read v" + older.getKey() + ": "
                + result.getResult().getIncompatibilities());
          }
        }
      }
    });
    return problems;
  }
}
