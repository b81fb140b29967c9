package dev.agentblackbox.consumer;

import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.apache.avro.Schema;
import org.apache.avro.file.DataFileReader;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.SchemaStore;

/**
 * Reads a recorded history: a file of messages as the topic carries them, or an Avro
 * container file of envelopes (the project's archives and golden histories).
 *
 * <p>A message value is Avro single-object encoding: {@code C3 01}, the 8-byte
 * little-endian CRC-64-AVRO fingerprint of the writer schema's parsing canonical form,
 * then the envelope's Avro binary. Avro's own {@link BinaryMessageDecoder} reads it,
 * finding the writer among the published {@code envelope.v<N>.avsc} files. A messages
 * file holds each value after its length (4 bytes, big-endian).
 */
final class History {
  private History() {}

  static List<Envelope> read(Path file, Path schemas) throws IOException {
    if (file.getFileName().toString().endsWith(".avro")) {
      return archive(file);
    }
    return messages(file, schemas);
  }

  private static List<Envelope> archive(Path file) throws IOException {
    List<Envelope> envelopes = new ArrayList<>();
    GenericDatumReader<GenericRecord> datum = new GenericDatumReader<>();
    try (DataFileReader<GenericRecord> reader = new DataFileReader<>(file.toFile(), datum)) {
      for (GenericRecord record : reader) {
        envelopes.add(new Envelope(record));
      }
    }
    return envelopes;
  }

  private static List<Envelope> messages(Path file, Path schemas) throws IOException {
    SchemaStore.Cache store = new SchemaStore.Cache();
    Schema newest = null;
    for (int version = 1; Files.exists(schemas.resolve("envelope.v" + version + ".avsc")); version++) {
      newest = new Schema.Parser().parse(schemas.resolve("envelope.v" + version + ".avsc").toFile());
      store.addSchema(newest);
    }
    if (newest == null) {
      throw new IOException("no envelope.v1.avsc in " + schemas);
    }
    // Read at the newest envelope version: Avro resolves older writers to it.
    BinaryMessageDecoder<GenericRecord> decoder =
        new BinaryMessageDecoder<>(GenericData.get(), newest, store);
    List<Envelope> envelopes = new ArrayList<>();
    try (InputStream raw = Files.newInputStream(file);
        DataInputStream in = new DataInputStream(raw)) {
      while (true) {
        int length;
        try {
          length = in.readInt();
        } catch (EOFException end) {
          return envelopes;
        }
        byte[] value = in.readNBytes(length);
        envelopes.add(new Envelope(decoder.decode(value)));
      }
    }
  }
}
