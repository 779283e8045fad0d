package io.lakebroker.delta;

import io.delta.storage.LocalLogStore;
import java.io.BufferedWriter;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * Delta LogStore for the local filesystem whose commits are put-if-absent across processes.
 *
 * <p>Delta's stock LocalLogStore only serialises writers inside one JVM (exists-check, then a
 * rename that silently replaces), so a delta-rs writer in another process could have its commit
 * N overwritten by Spark's. A hard link, unlike rename(2), fails atomically when the target
 * exists, which gives the same guarantee as delta-rs's rename-no-replace commit. An overwrite
 * ({@code _last_checkpoint}) is an atomic rename over the old file, so no reader sees it half-written.
 *
 * <p>Enable with {@code spark.delta.logStore.file.impl=io.lakebroker.delta.AtomicLocalLogStore}.
 */
public class AtomicLocalLogStore extends LocalLogStore {

  public AtomicLocalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    java.nio.file.Path target =
        Paths.get(path.getFileSystem(hadoopConf).makeQualified(path).toUri());
    java.nio.file.Path dir = target.getParent();
    Files.createDirectories(dir);
    // Dot-prefixed temp name in the same directory: same filesystem (links and atomic moves can't
    // cross one) and ignored by Delta's and delta-rs's log listing should a crash leave it behind.
    java.nio.file.Path temp = Paths.get(createTempPath(new Path(target.toUri())).toUri());
    try {
      writeDurably(temp, actions);
      if (overwrite) {
        // Last writer wins (_last_checkpoint), but never in place: a file truncated and rewritten
        // is seen empty by a concurrent reader in another process (delta-rs failed a table load so).
        // Hadoop's checksum sidecar goes first, so a stale one never sits beside new content.
        Files.deleteIfExists(dir.resolve("." + target.getFileName() + ".crc"));
        Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
      } else {
        // Throws FileAlreadyExistsException if the version exists: Delta treats that as a
        // concurrent commit and re-runs conflict detection for the next version.
        Files.createLink(target, temp);
      }
    } catch (FileAlreadyExistsException e) {
      throw new FileAlreadyExistsException(path.toString());
    } finally {
      Files.deleteIfExists(temp);
    }
    // Persist the new directory entry too, so an acknowledged commit survives a power loss.
    try (FileChannel d = FileChannel.open(dir, StandardOpenOption.READ)) {
      d.force(true);
    }
  }

  /** Writes one action per line and syncs: a file must be durable before it gets its real name. */
  private static void writeDurably(java.nio.file.Path file, Iterator<String> actions) throws IOException {
    try (FileOutputStream out = new FileOutputStream(file.toFile());
        Writer writer = new BufferedWriter(new OutputStreamWriter(out, StandardCharsets.UTF_8))) {
      while (actions.hasNext()) {
        writer.write(actions.next());
        writer.write('\n');
      }
      writer.flush();
      out.getFD().sync();
    }
  }

  /**
   * True: a local file is readable from its first byte. Delta then writes each checkpoint
   * ({@code N.checkpoint.parquet}) to a temp file and renames it into place, so a delta-rs reader
   * or a killed job never meets a torn one. Commits do not consult this: they always go through
   * {@link #write} with {@code overwrite=false}, which stays put-if-absent. (It also turns on
   * Delta's in-JVM commit lock, as for the stock LocalLogStore.)
   */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return true;
  }
}
