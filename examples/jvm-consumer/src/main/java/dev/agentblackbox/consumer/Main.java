package dev.agentblackbox.consumer;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Reads recorded histories of agent-blackbox and checks them against the contract.
 *
 * <pre>
 * java -cp ... dev.agentblackbox.consumer.Main --schemas schemas/avsc \
 *     --dictionaries schemas/dictionaries [--vectors FILE] HISTORY...
 * </pre>
 *
 * Prints one {@code summary {...}} line per history, then the compatibility and vector
 * checks, then every failure; exits 1 when anything failed.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws IOException {
    Path schemas = null;
    Path dictionaries = null;
    Path vectors = null;
    List<Path> histories = new ArrayList<>();
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--schemas" -> schemas = Path.of(args[++i]);
        case "--dictionaries" -> dictionaries = Path.of(args[++i]);
        case "--vectors" -> vectors = Path.of(args[++i]);
        default -> histories.add(Path.of(args[i]));
      }
    }
    if (schemas == null || dictionaries == null) {
      System.err.println("usage: --schemas DIR --dictionaries DIR [--vectors FILE] HISTORY...");
      System.exit(2);
    }
    Payloads payloads = new Payloads(schemas, dictionaries);
    List<String> failures = new ArrayList<>();
    for (Path history : histories) {
      Verifier verifier = new Verifier(payloads);
      for (Envelope envelope : History.read(history, schemas)) {
        verifier.take(envelope);
      }
      System.out.println("summary " + verifier.summary(history.getFileName().toString()));
      verifier.failures.forEach(f -> failures.add(history.getFileName() + ": " + f));
    }
    int[] pairs = {0};
    List<String> incompatible = Compatibility.check(payloads.bodySchemas(), pairs);
    System.out.println("compatibility {\"pairs\":" + pairs[0] + ",\"incompatible\":"
        + incompatible.size() + "}");
    failures.addAll(incompatible);
    if (vectors != null) {
      failures.addAll(vectors(vectors));
    }
    failures.forEach(f -> System.out.println("failure " + f));
    System.exit(failures.isEmpty() ? 0 : 1);
  }

  /**
   * Canonical JSON written by the recorder's RFC 8785 serialiser, each line a JSON array
   * {@code [input text, its canonical form]}: the JCS library must write the same.
   */
  private static List<String> vectors(Path file) throws IOException {
    ObjectMapper mapper = new ObjectMapper();
    List<String> failures = new ArrayList<>();
    int checked = 0;
    for (String line : Files.readAllLines(file, StandardCharsets.UTF_8)) {
      JsonNode pair = mapper.readTree(line);
      String input = pair.get(0).asText();
      String expected = pair.get(1).asText();
      String written = new String(Json.canonical(input), StandardCharsets.UTF_8);
      checked++;
      if (!written.equals(expected)) {
        failures.add("vector " + checked + ": recorder wrote " + expected + ", JCS library " + written);
      }
    }
    System.out.println("vectors {\"checked\":" + checked + ",\"differ\":" + failures.size() + "}");
    return failures;
  }
}
