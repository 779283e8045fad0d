"""The one typed settings object. Every field is also `LAKEBROKER_<FIELD>` in the environment."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lakebroker.tables import user_cache
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.storage import parse_root


class AuthMode(StrEnum):
    AUTO = "auto"  # required unless `serve` binds a loopback address
    REQUIRED = "required"
    OFF = "off"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


# Spark confs lakebroker owns (spark_pipeline/session.py): `spark_conf` may not override them.
OWNED_SPARK_CONF = ("spark.delta.logStore.", "spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.jars")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LAKEBROKER_", extra="forbid")

    # storage
    data_dir: Path = Field(Path("data"), description="Root of the WAL, the dedup state, the lock file and (unless "
                           "tables_uri says otherwise) the Delta tables.")
    tables_uri: str | None = Field(
        None, description="Where every topic and `_system` table lives: a local path or s3://bucket/prefix "
        "(endpoint and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). "
        "None: the data dir. The WAL, dedup state and lock always stay local, under the data dir."
    )
    jars_dir: Path | None = Field(
        None, description="The Delta, S3A and LogStore jars of Spark sessions. None: the per-user cache that "
        "`lakebroker spark setup` fills ($LAKEBROKER_CACHE_DIR, else $XDG_CACHE_HOME/lakebroker, else "
        "~/.cache/lakebroker)."
    )

    # serving
    host: str = Field("127.0.0.1", description="Address `lakebroker serve` binds.")
    port: int = Field(8080, ge=0, le=65535, description="Port `lakebroker serve` binds.")
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Largest HTTP request body accepted.")
    body_read_timeout_s: float = Field(
        60.0, gt=0, description="A request body must arrive whole within this many seconds of the server starting "
        "to read it, or the answer is 408 and the connection is closed (a slow upload cannot hold a slot). A "
        "Kafka request must likewise arrive whole within it once its size has, or its connection is closed."
    )
    header_read_timeout_s: float = Field(
        10.0, gt=0, description="A request's line and headers must arrive whole within this many seconds of the "
        "connection opening (on a keep-alive connection: of the first read of the next request), or the answer is "
        "408 and the connection is closed (a slowloris client cannot hold a slot)."
    )
    fast_produce: bool = Field(
        True, description="Answer a plain single-message produce in the HTTP protocol itself, below ASGI, "
        "without the framework's per-request work. It relies on uvicorn internals that tests pin; turn it off if "
        "an upgraded uvicorn breaks it: every request then takes the ASGI path, with the same answers."
    )

    # the Kafka listener (ingest_api/kafka/, docs/kafka.md)
    kafka_listener: bool = Field(
        True, description="Serve Kafka's protocol beside HTTP, on HOST at KAFKA_PORT, so Kafka clients produce "
        "by pointing bootstrap.servers at the broker. With auth required, clients authenticate with SASL/PLAIN "
        "and an API token as the password."
    )
    kafka_port: int = Field(9092, ge=0, le=65535, description="Port of the Kafka listener (0: any free port).")
    kafka_acks_all: Literal["wal", "table"] = Field(
        "wal", description="What a Kafka producer's acks=all (the default of current Kafka clients) waits for: "
        "`wal`, the message fsynced in this node's WAL, as the HTTP API's default ack; or `table`, committed to "
        "the topic's Delta table, where it survives the loss of this node, at the cost of a flush interval per "
        "request (a Kafka client keeps at most 5 requests in flight per connection). acks=1 waits for the WAL "
        "and acks=0 for nothing."
    )

    kafka_tls_cert: Path | None = Field(
        None, description="A PEM certificate chain (the server's certificate first): with KAFKA_TLS_KEY, the Kafka "
        "listener speaks TLS only (clients connect with security.protocol=SSL, or SASL_SSL when auth is required)."
    )
    kafka_tls_key: Path | None = Field(None, description="The PEM private key of KAFKA_TLS_CERT.")

    # cluster (ingest_api/cluster.py, tables/ownership.py)
    advertised_url: str | None = Field(
        None, description="The URL other nodes and clients use to reach this node. None: http://HOST:PORT of "
        "`serve` (with the machine's name for a wildcard HOST)."
    )
    ingest_lease_ttl_s: float = Field(
        8.0, gt=1, description="A node's partitions move to live nodes this long after its last heartbeat."
    )
    ingest_heartbeat_s: float = Field(
        1.0, gt=0, description="How often a node looks at the cluster: new nodes and topics, partitions to take or "
        "hand over. Its lease is renewed every half TTL."
    )

    # access control (ingest_api/auth.py, tables/tokens.py)
    auth: AuthMode = Field(
        AuthMode.AUTO, description="API tokens on every route but the health checks: required, off, or auto = "
        "required unless `serve` binds a loopback address (127.0.0.0/8, ::1, localhost)."
    )
    metrics_public: bool = Field(False, description="Serve /metrics without a token (scraper on a trusted network).")
    docs_public: bool = Field(
        True, description="Serve /docs, /redoc and /openapi.json without a token; false removes them."
    )
    auth_cache_ms: int = Field(
        1000, ge=0, description="How long the server trusts its copy of the token table; a revoke or a new "
        "token takes effect within this."
    )
    token: SecretStr | None = Field(None, description="API token the CLI sends to a running server.")

    # topics
    default_partitions: int = Field(3, ge=1, le=1024, description="Partitions of a topic created without a count.")
    default_max_message_bytes: int = Field(1024 * 1024, gt=0, description="Default per-topic message size limit.")

    # write-ahead log
    wal_segment_bytes: int = Field(64 * 1024 * 1024, gt=0, description="Size at which a WAL segment is rolled.")
    wal_fsync: bool = Field(True, description="fsync each WAL group commit; turn off only for throwaway data.")
    # Every accepted byte not yet in Delta is held in memory until its commit: this bounds those
    # rows under floods, and how long a Delta outage is absorbed before 429 (docs/operations.md).
    max_backlog_bytes: int = Field(
        64 * 1024 * 1024, gt=0,
        description="Accepted bytes not yet in Delta (held in memory) above which a produce waits for room, "
        "then answers 429.",
    )
    backpressure_wait_ms: int = Field(
        2000, ge=0,
        description="Longest a produce waits for a Delta commit to make room under max_backlog_bytes before 429 "
        "(batches and REST v2; a single message is answered at once).",
    )

    # flusher
    # 250 ms, like a producer's linger: each commit costs delta-rs tens of ms of CPU whatever its size,
    # on the cores the event loop needs (docs/operations.md, "Why a commit every 250 ms").
    flush_interval_ms: int = Field(250, gt=0, description="Longest a WAL record waits before its Delta commit.")
    # Commits few enough for a flood to keep up beside other topics' commits (docs/operations.md).
    flush_max_records: int = Field(
        500_000, gt=0,
        description="Records that trigger a Delta commit early; also the most one commit takes from a topic.",
    )
    # Small enough that rows waiting behind a commit stay a fraction of max_backlog_bytes under a flood.
    flush_max_bytes: int = Field(
        16 * 1024 * 1024, gt=0,
        description="Bytes that trigger a Delta commit early; also the most one commit takes from a topic.",
    )

    # Below the event loop's, so a produce goes first when the CPU is full (tables/runtime_priority.py).
    delta_threads_nice: int = Field(
        10, ge=0, le=19,
        description="CPU niceness of delta-rs's runtime threads (Delta commits and checkpoints) in a serving "
        "broker; 0 keeps the server's own. Linux only.",
    )

    # idempotent produce
    dedup_window_s: int = Field(3600, ge=0, description="How long a message id or producer sequence is remembered.")
    dedup_max_entries: int = Field(2_000_000, gt=0, description="Most ids remembered; the oldest are forgotten first.")

    # delivery
    deliver_in_serve: bool = Field(True, description="Run a delivery worker with `lakebroker serve`.")
    delivery_mode: Literal["process", "inprocess"] = Field(
        "process", description="How `serve` runs its delivery worker: `process` = a supervised child process "
        "(restarted with backoff if it dies, stopped with serve), so the ingest event loop never waits on delivery; "
        "`inprocess` = a task on the ingest event loop (tests that read the worker's live state)."
    )
    allow_private_webhooks: bool = Field(
        False, description="Allow webhook URLs on private, loopback or link-local addresses (SSRF guard off)."
    )
    delivery_poll_ms: int = Field(50, gt=0, description="How often a delivery worker looks for new commits.")
    delivery_read_ahead_bytes: int = Field(
        16 * 1024 * 1024, ge=1, description="Message bytes a delivery worker reads ahead and holds for one partition "
        "of one subscription (up to 1,000 messages; always at least one message)."
    )
    delivery_read_ahead_total_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="Message bytes a delivery worker process holds for all its partitions "
        "together: read ahead, being read, and in the bodies of the requests in flight; a partition with nothing "
        "held may still read one message."
    )
    offset_commit_interval_ms: int = Field(
        1000, gt=0, description="How often delivered offsets are committed; bounds redelivery after a crash."
    )
    lease_ttl_s: float = Field(10.0, gt=1, description="A worker's partitions move to others this long after it dies.")
    heartbeat_s: float = Field(2.0, gt=0, description="How often a worker renews its leases and rebalances.")
    operational_webhook_url: str | None = Field(
        None, description="Where delivery workers POST subscription.disabled and subscription.recovered events, "
        "signed like every delivery (delivery_worker/operational.py); none: not sent."
    )
    operational_webhook_secret: SecretStr | None = Field(
        None, description="The whsec_... secret that signs the operational webhooks; needed with the URL."
    )

    # spark
    spark_master: str = Field("local[*]", description="Master URL for Spark jobs and `lakebroker sql`.")
    spark_driver_memory: str = Field("1g", description="Driver memory of Spark jobs.")
    spark_conf: dict[str, str] = Field(
        {}, description="Extra Spark confs for every Spark session lakebroker starts (the jobs, `lakebroker sql`, "
        "spark-submit runs from the scheduler and the DAGs), applied over lakebroker's own; as JSON in the "
        'environment, e.g. {"spark.sql.shuffle.partitions": "64"}.'
    )

    # --- spark maintenance jobs (spark_pipeline/jobs; scheduled inside `serve` by spark_pipeline/scheduler.py) ---
    compaction_interval_s: int = Field(300, ge=0, description="Seconds between scheduled compaction runs; 0 disables.")
    retention_interval_s: int = Field(300, ge=0, description="Seconds between scheduled retention runs; 0 disables.")
    key_compaction_interval_s: int = Field(
        600, ge=0, description="Seconds between scheduled key-compaction runs (cleanup_policy=compact); 0 disables."
    )
    offsets_compaction_interval_s: int = Field(
        3600, ge=0, description="Seconds between scheduled consumer-offsets compaction runs; 0 disables."
    )
    replication_uri: str | None = Field(
        None, description="Second storage location that `serve` replicates every table to; None turns it off."
    )
    replication_interval_s: int = Field(60, ge=0, description="Seconds between scheduled replication runs; 0 disables.")
    job_timeout_s: int = Field(3600, gt=0, description="A scheduled job running longer is killed and recorded failed.")
    compaction_target_file_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="Compaction bin-packs small files into files of about this size."
    )
    compaction_min_files: int = Field(2, ge=2, description="Fewest adjacent small files worth rewriting as one.")
    vacuum_retention_hours: float = Field(
        168.0, ge=0, description="VACUUM deletes unreferenced files older than this. It must exceed the longest "
        "read, the replication lag and any in-flight write; below 168 disables Delta's safety check (tests only)."
    )
    retention_trim_partial_files: bool = Field(
        False, description="Also rewrite the one file per partition that straddles the time-retention cutoff, so "
        "no row outlives retention_ms; off keeps Kafka's whole-segment semantics (no rewrite)."
    )
    key_compaction_min_lag_ms: int = Field(
        60_000, ge=0, description="Key compaction never touches rows younger than this (Kafka's "
        "min.compaction.lag.ms; the tail of each partition stays as produced)."
    )
    job_runs_retention_days: int = Field(
        30, ge=1, description="How long `_system/job_runs` and `_system/retention_skips` rows are kept."
    )
    # --- end spark maintenance jobs ---

    # operator
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of `serve`, `deliver` and the Spark jobs.")
    log_format: LogFormat = Field(
        LogFormat.TEXT, description="`text` (one human-readable line per record) or `json` (one JSON object per "
        "line: timestamp, level, logger, message; see tables/logs.py)."
    )
    access_log: bool = Field(
        False, description="Log every HTTP request `serve` answers (uvicorn's access log: client, method, path, "
        "status); off by default, since it costs the hot path a log record per request."
    )

    @field_validator("tables_uri")
    @classmethod
    def _valid_tables_uri(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            return parse_root(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    @field_validator("spark_conf")
    @classmethod
    def _no_owned_spark_conf(cls, value: dict[str, str]) -> dict[str, str]:
        owned = sorted(k for k in value if k.startswith(OWNED_SPARK_CONF))
        if owned:
            raise ValueError(f"spark_conf may not set {', '.join(owned)}: lakebroker sets it (its Delta extension, "
                             "jars and put-if-absent LogStore keep Spark's commits safe beside the flusher's)")
        return value

    @model_validator(mode="after")
    def _kafka_tls_pair(self) -> Settings:
        if (self.kafka_tls_cert is None) != (self.kafka_tls_key is None):
            raise ValueError("kafka_tls_cert and kafka_tls_key come together: the listener needs the certificate "
                             "and its key")
        return self

    @model_validator(mode="after")
    def _operational_webhook_pair(self) -> Settings:
        if (self.operational_webhook_url is None) != (self.operational_webhook_secret is None):
            raise ValueError("operational_webhook_url and operational_webhook_secret come together: the events "
                             "are signed")
        if self.operational_webhook_secret is not None:
            from lakebroker.tables.subscriptions import validate_secret

            try:
                validate_secret(self.operational_webhook_secret.get_secret_value())
            except InvalidRequest as exc:
                raise ValueError(f"operational_webhook_secret: {exc.message}") from None
        return self

    @property
    def spark_jars_dir(self) -> Path:
        return self.jars_dir if self.jars_dir is not None else user_cache.jars_dir()

    def ensure_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
