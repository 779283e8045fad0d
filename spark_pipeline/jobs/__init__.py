"""The Spark maintenance jobs, one module each.

Every module has `run(spark, settings, topic=None, ...) -> JobResult` (library use: tests, the CLI),
and a `main()` / `__main__` entry point taking `--data-dir`, `--master`, `--topic` (spark-submit,
`python -m lakebroker.spark_pipeline.jobs.<job>`, the scheduler of `lakebroker serve`, Airflow):

    compaction          ordered bin-packing of small files, checkpoint, log cleanup
    retention           retention_ms / retention_bytes, lagging groups moved (recorded), VACUUM
    key_compaction      latest value per key (cleanup_policy=compact), tombstones after a delay
    offsets_compaction  latest offset per group and partition
    replication         incremental copy to a second location (+ verify_replica)

Nothing here is imported by the ingest process; pyspark is imported lazily inside functions.
"""
