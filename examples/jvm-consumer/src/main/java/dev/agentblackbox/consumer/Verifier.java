package dev.agentblackbox.consumer;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.avro.generic.GenericRecord;

/**
 * Follows each run of a history: its sequence and hash chain, its bodies, and (for runs
 * hashed over RFC 8785 with plain SHA-256 digests) every input and output digest and
 * every request rebuilt from a reference. Keeps per run what a consumer must keep: the
 * last sequence and chain hash, the canonicalisation, and the latest llm.call requests.
 */
final class Verifier {
  private static final String GENESIS = "0".repeat(64);

  private final Payloads payloads;
  private final Requests requests = new Requests();
  private final Map<String, Run> runs = new LinkedHashMap<>();
  private final Map<String, Integer> counts = new TreeMap<>();
  private final Map<String, Integer> encodings = new TreeMap<>();
  final List<String> failures = new ArrayList<>();

  private static final class Run {
    long last;
    String head = GENESIS;
    String canonicalisation;
    boolean broken;
  }

  Verifier(Payloads payloads) {
    this.payloads = payloads;
  }

  void take(Envelope envelope) {
    count("events");
    Run run = runs.computeIfAbsent(envelope.runId(), id -> new Run());
    String where = "run " + envelope.runId() + " sequence " + envelope.sequence();
    String canonicalisation = envelope.canonicalisation();
    if (!canonicalisation.equals("v1") && !canonicalisation.equals("rfc8785")) {
      fail(where + ": unknown canonicalisation " + canonicalisation);
      run.broken = true;
      return;
    }
    if (run.canonicalisation == null) {
      run.canonicalisation = canonicalisation;
    }
    try {
      chain(envelope, run, where);
      body(envelope, canonicalisation.equals("rfc8785"), where);
    } catch (IOException | RuntimeException e) {
      fail(where + ": " + e);
    }
  }

  private void chain(Envelope envelope, Run run, String where) throws IOException {
    if (envelope.sequence() != run.last + 1) {
      fail(where + ": expected sequence " + (run.last + 1));
      run.broken = true;
    }
    String material = ChainMaterial.of(envelope);
    if (envelope.canonicalisation().equals("rfc8785")
        && !new String(Json.canonical(material), java.nio.charset.StandardCharsets.UTF_8)
            .equals(material)) {
      fail(where + ": the chain material written here is not what the JCS library writes");
    }
    byte[] previous = HexFormat.of().parseHex(run.head);
    byte[] text = Json.utf8(material);
    byte[] joined = new byte[previous.length + text.length];
    System.arraycopy(previous, 0, joined, 0, previous.length);
    System.arraycopy(text, 0, joined, previous.length, text.length);
    String expected = HexFormat.of().formatHex(Json.sha256Bytes(joined));
    if (!expected.equals(envelope.text("chain_hash"))) {
      fail(where + ": chain hash " + envelope.text("chain_hash") + ", expected " + expected);
      run.broken = true;
    }
    run.head = envelope.text("chain_hash");
    run.last = envelope.sequence();
  }

  private void body(Envelope envelope, boolean rfc8785, String where) throws IOException {
    Payloads.Opened opened = payloads.open(envelope);
    encodings.merge(envelope.text("payload_encoding"), 1, Integer::sum);
    if (opened instanceof Payloads.Sealed) {
      count("sealed");
      return;
    }
    if (opened instanceof Payloads.OutOfLine) {
      count("out_of_line");
      return;
    }
    count("bodies_decoded");
    GenericRecord body = ((Payloads.Plain) opened).body();
    String type = envelope.eventType();
    String request = null;
    if (type.equals("llm.call")) {
      Requests.Rebuilt rebuilt = requests.read(envelope.runId(), envelope.sequence(), body);
      request = rebuilt.text();
      if (rebuilt.expectedSha256() != null) {
        count("requests_rebuilt");
        if (rfc8785 && !Json.sha256(Json.canonical(request)).equals(rebuilt.expectedSha256())) {
          fail(where + ": the rebuilt request does not match its request_sha256");
        }
      }
    }
    if (!rfc8785) {
      count("digests_version_1");
      return; // version 1 hashes Python's own JSON: for this project's readers
    }
    digest(envelope.text("input_digest"), Digests.input(type, body, request), where + " input");
    digest(envelope.text("output_digest"), Digests.output(type, body), where + " output");
  }

  private void digest(String recorded, String value, String where) throws IOException {
    if (value == null || !recorded.startsWith("sha256:")) {
      count("digests_keyed"); // hmac-sha256: needs the tenant's key
      return;
    }
    count("digests_checked");
    String actual = Json.sha256(Json.canonical(value));
    if (!actual.equals(recorded)) {
      fail(where + " digest " + recorded + ", rebuilt " + actual);
    }
  }

  private void count(String name) {
    counts.merge(name, 1, Integer::sum);
  }

  private void fail(String failure) {
    failures.add(failure);
  }

  /** The summary of one history, as one JSON object. */
  String summary(String file) {
    Map<String, String> out = new LinkedHashMap<>();
    out.put("file", Json.quote(file));
    out.put("runs", Integer.toString(runs.size()));
    long verified = runs.values().stream().filter(r -> !r.broken).count();
    out.put("chains_verified", Long.toString(verified));
    for (String name : List.of("events", "bodies_decoded", "sealed", "out_of_line",
        "requests_rebuilt", "digests_checked", "digests_keyed", "digests_version_1")) {
      out.put(name, Integer.toString(counts.getOrDefault(name, 0)));
    }
    Map<String, Integer> canonical = new TreeMap<>();
    runs.values().forEach(r -> canonical.merge(String.valueOf(r.canonicalisation), 1, Integer::sum));
    out.put("canonicalisations", counted(canonical));
    out.put("encodings", counted(encodings));
    out.put("failures", Integer.toString(failures.size()));
    return Json.object(out);
  }

  private static String counted(Map<String, Integer> counts) {
    Map<String, String> members = new HashMap<>();
    counts.forEach((k, v) -> members.put(k, v.toString()));
    return Json.object(new TreeMap<>(members));
  }
}
