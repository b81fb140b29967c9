package dev.agentblackbox.consumer;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdDictDecompress;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;

/**
 * Opens payloads: {@code payload_encoding} names the steps after the Avro body,
 * {@code avro[+<compression>][+<sealing>...]}. Compressions: {@code zstd-d<N>} (zstd with
 * shared dictionary N, the file {@code payload-d<N>.zdict}), {@code zstd} (no dictionary),
 * {@code deflate} (zlib: RFC 1950 header and Adler-32). Anything after the compression
 * is sealing ({@code aes256gcm+aad2}): for the project's own readers, which hold the
 * keys.
 */
final class Payloads {
  /** What became of one payload. */
  sealed interface Opened permits Plain, Sealed, OutOfLine {}

  record Plain(GenericRecord body, String compression) implements Opened {}

  record Sealed(String encoding) implements Opened {}

  record OutOfLine(String ref) implements Opened {}

  private static final Pattern FILE = Pattern.compile("(?<type>[a-z_.]+)\\.v(?<version>\\d+)\\.avsc");
  private static final Pattern DICTIONARY = Pattern.compile("zstd-d(\\d+)");

  private final Map<String, Schema> bodies = new HashMap<>();
  private final Path dictionaries;
  private final Map<Integer, ZstdDictDecompress> loaded = new HashMap<>();

  /** Body schemas from {@code <type>.v<version>.avsc} files; dictionaries by number. */
  Payloads(Path schemas, Path dictionaries) throws IOException {
    this.dictionaries = dictionaries;
    try (var files = Files.list(schemas)) {
      for (Path file : (Iterable<Path>) files::iterator) {
        Matcher name = FILE.matcher(file.getFileName().toString());
        if (name.matches() && !name.group("type").equals("envelope")) {
          // Each file on its own parser: every version names its records alike.
          bodies.put(key(name.group("type"), Integer.parseInt(name.group("version"))),
              new Schema.Parser().parse(file.toFile()));
        }
      }
    }
  }

  Map<String, Schema> bodySchemas() {
    return bodies;
  }

  static String key(String type, int version) {
    return type + ".v" + version;
  }

  /** Open the payload of {@code envelope} down to its body, where this reader can. */
  Opened open(Envelope envelope) throws IOException {
    byte[] stored = envelope.payload();
    if (stored == null) {
      return new OutOfLine(envelope.text("payload_ref"));
    }
    String encoding = envelope.text("payload_encoding");
    String[] steps = encoding.split("\\+");
    if (!steps[0].equals("avro")) {
      throw new IOException("unknown body format in payload_encoding " + encoding);
    }
    String compression = steps.length > 1 && isCompression(steps[1]) ? steps[1] : null;
    int sealing = compression == null ? 1 : 2;
    if (steps.length > sealing) {
      return new Sealed(encoding);
    }
    byte[] avro = compression == null ? stored : inflate(compression, stored);
    return new Plain(decode(envelope.eventType(), envelope.bodyVersion(), avro), compression);
  }

  private static boolean isCompression(String step) {
    return step.equals("zstd") || step.equals("deflate") || DICTIONARY.matcher(step).matches();
  }

  private byte[] inflate(String compression, byte[] data) throws IOException {
    if (compression.equals("deflate")) {
      return deflated(data);
    }
    long size = Zstd.getFrameContentSize(data);
    if (size < 0 || size > Integer.MAX_VALUE) {
      throw new IOException("a zstd payload must say how large it inflates");
    }
    if (compression.equals("zstd")) {
      return Zstd.decompress(data, (int) size);
    }
    Matcher number = DICTIONARY.matcher(compression);
    if (!number.matches()) {
      throw new IOException("unknown compression " + compression);
    }
    return Zstd.decompress(data, dictionary(Integer.parseInt(number.group(1))), (int) size);
  }

  private ZstdDictDecompress dictionary(int number) throws IOException {
    ZstdDictDecompress found = loaded.get(number);
    if (found == null) {
      byte[] raw = Files.readAllBytes(dictionaries.resolve("payload-d" + number + ".zdict"));
      found = new ZstdDictDecompress(raw);
      loaded.put(number, found);
    }
    return found;
  }

  private static byte[] deflated(byte[] data) throws IOException {
    Inflater inflater = new Inflater(); // zlib-wrapped, as Python's zlib.compress writes
    inflater.setInput(data);
    ByteArrayOutputStream out = new ByteArrayOutputStream(data.length * 4);
    byte[] chunk = new byte[8192];
    try {
      while (!inflater.finished()) {
        int count = inflater.inflate(chunk);
        if (count == 0 && (inflater.needsInput() || inflater.needsDictionary())) {
          throw new IOException("the deflate payload is truncated");
        }
        out.write(chunk, 0, count);
      }
    } catch (DataFormatException e) {
      throw new IOException("the deflate payload is corrupt", e);
    } finally {
      inflater.end();
    }
    return out.toByteArray();
  }

  /** A schemaless Avro body, by the writer schema its envelope names. */
  GenericRecord decode(String type, int version, byte[] avro) throws IOException {
    Schema writer = bodies.get(key(type, version));
    if (writer == null) {
      throw new IOException("no schema " + key(type, version) + ".avsc");
    }
    BinaryDecoder decoder = DecoderFactory.get().binaryDecoder(avro, null);
    GenericRecord body = new GenericDatumReader<GenericRecord>(writer).read(null, decoder);
    if (!decoder.isEnd()) {
      throw new IOException(key(type, version) + " body has trailing bytes");
    }
    return body;
  }
}
