package io.lakebroker.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * Delta LogStore for S3 (S3A) whose commits are put-if-absent, from any number of writers.
 *
 * <p>Each commit file is created with S3A's conditional create ({@code
 * fs.option.create.conditional.overwrite}): the object is PUT with {@code If-None-Match: *}, which
 * the store refuses with 412 if the version exists. That is the same guarantee delta-rs's commits
 * get from object_store's conditional put, so Spark jobs and delta-rs writers can commit to the
 * same table on S3 with no lock service. Delta's own S3SingleDriverLogStore is only safe with one
 * writing JVM (its check-then-write is serialised in-process), so it is not used.
 *
 * <p>Enable with {@code spark.delta.logStore.s3a.impl=io.lakebroker.delta.S3ConditionalLogStore}
 * (and the same for the {@code s3} scheme).
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {

  public S3ConditionalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    var builder = fs.createFile(path).overwrite(overwrite).recursive();
    if (!overwrite) {
      // must(): fail rather than silently write unconditionally on a store that can't do this.
      builder.must(Options.CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE, true);
    }
    // S3 objects appear whole when the stream closes (the PUT happens there), so a reader never
    // sees a partial commit and the conditional PUT's answer arrives from close().
    try (FSDataOutputStream out = builder.build()) {
      while (actions.hasNext()) {
        out.write(actions.next().getBytes(StandardCharsets.UTF_8));
        out.write('\n');
      }
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException | RemoteFileChangedException e) {
      // Delta treats java.nio's FileAlreadyExistsException as "another writer took this version":
      // it re-reads the log, checks for conflicts and retries at the next version.
      if (overwrite) {
        throw e;
      }
      FileAlreadyExistsException taken = new FileAlreadyExistsException(path.toString());
      taken.initCause(e);
      throw taken;
    }
  }

  /** False: an S3 object is invisible until complete, so Delta writes checkpoints in place. */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }
}
