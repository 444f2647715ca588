"""Service settings, from ``LEDGER_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger.errors import InvalidInput
from ledger.worker_url import UrlPolicy

# Production refuses a longer token cache: a revoked token must stop working within a minute.
PRODUCTION_MAX_TOKEN_CACHE = 60.0


MIN_PRODUCTION_RETENTION_DAYS = 183


class Settings(BaseSettings):
    """All settings; nothing is read until a Settings() is built (never at import time)."""

    # allow_inf_nan=False: no setting may be NaN or infinite (LEDGER_TOKEN_CACHE_SECONDS=inf).
    model_config = SettingsConfigDict(env_prefix="LEDGER_", extra="ignore", allow_inf_nan=False)

    environment: Literal["development", "production"] = "development"
    data_dir: Path = Path("ledger-data")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file in data_dir"
    )
    log_key_file: Path | None = Field(
        default=None, description="the ledger's Ed25519 key (PEM); default data_dir/log-key.pem"
    )
    admin_token_file: Path | None = Field(
        default=None, description="where the first-start admin token is written"
    )
    log_origin: str | None = Field(
        default=None, description="checkpoint origin line; default derived from the log key"
    )
    checkpoint_interval: float = Field(
        default=1.0, ge=0, description="seconds between checkpoints while the log grows; 0: off"
    )
    token_cache_seconds: float = Field(
        default=5.0, ge=0, description="how long a verified token is trusted without a lookup"
    )
    max_inflight_batches: int = Field(
        default=64, ge=1, description="ingest batches processed at once per worker; more get 503"
    )
    max_inflight_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="bytes of ingest bodies in flight per worker (Content-Length, or the body "
        "limit when a body declares none); more get 503, one batch is always admitted",
    )
    cache_memory_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=0,
        description="memory per worker for verified cache answers (estimated from the records "
        "they hold; least recently used out; 0: none kept, every lookup checks the log)",
    )
    worker_ttl: float = Field(
        default=15.0, gt=0, description="a worker is live while its last heartbeat is this recent"
    )
    max_workers_per_key: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="worker IDs one collector key may hold (409 too_many_workers beyond; its "
        "workers unseen for a day are forgotten to make room)",
    )
    replay_timeout: float = Field(
        default=300.0, gt=0, description="seconds a worker may take to answer a replay order"
    )
    worker_networks: str = Field(
        default="",
        description="comma-separated CIDRs worker URLs may reach (empty: any address but "
        "link-local, metadata, unspecified, multicast, broadcast; see ledger/worker_url.py)",
    )
    content_retention_days: int | None = Field(
        default=None,
        ge=1,
        le=36500,  # a century: beyond it the cutoff would leave the calendar
        description="erase records' content (schema v2) received more than this many days ago; "
        "unset: keep forever. Production refuses under 183 days unless "
        "LEDGER_ALLOW_SHORT_RETENTION=1",
    )
    allow_short_retention: bool = Field(
        default=False,
        description="let production keep content fewer than 183 days (EU AI Act Art. 19 "
        "asks providers of high-risk systems for at least six months)",
    )
    retention_interval: float = Field(
        default=3600.0, gt=0, description="seconds between retention purges"
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8700, ge=0, le=65535)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_batch_records: int = Field(default=1000, ge=1)
    body_timeout: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="seconds a request's body may take once the API reads it; then 408 "
        "body_timeout",
    )

    ui_session_seconds: float = Field(
        default=8 * 3600,
        ge=60,
        le=7 * 86400,
        description="how long a console sign-in lasts (the session cookie's lifetime; the "
        "token's own expiry or revocation ends it sooner)",
    )

    @field_validator("worker_networks")
    @classmethod
    def _networks_parse(cls, value: str) -> str:
        try:
            UrlPolicy.parse(value)
        except InvalidInput as exc:
            raise ValueError(f"LEDGER_WORKER_NETWORKS: {exc.message}") from exc
        return value

    @field_validator("log_origin")
    @classmethod
    def _origin_is_one_token(cls, value: str | None) -> str | None:
        if value is not None and (
            not value or any(c.isspace() for c in value) or "+" in value or len(value) > 200
        ):
            raise ValueError(
                "LEDGER_LOG_ORIGIN must be one line of at most 200 characters, without "
                "spaces or '+' (e.g. ledger.example.com/log)"
            )
        return value

    @model_validator(mode="after")
    def _production_is_explicit(self) -> Settings:
        if self.environment == "production":
            if not self.database_url or self.database_url.startswith("sqlite"):
                raise ValueError(
                    "LEDGER_ENVIRONMENT=production needs LEDGER_DATABASE_URL set to Postgres"
                )
            if self.log_key_file is None:
                raise ValueError("LEDGER_ENVIRONMENT=production needs LEDGER_LOG_KEY_FILE set")
            if self.token_cache_seconds > PRODUCTION_MAX_TOKEN_CACHE:
                raise ValueError(
                    f"LEDGER_TOKEN_CACHE_SECONDS={self.token_cache_seconds:g}: production allows "
                    f"at most {PRODUCTION_MAX_TOKEN_CACHE:g} (a revoked token is trusted that long)"
                )
            if (
                self.content_retention_days is not None
                and self.content_retention_days < MIN_PRODUCTION_RETENTION_DAYS
                and not self.allow_short_retention
            ):
                raise ValueError(
                    f"LEDGER_CONTENT_RETENTION_DAYS={self.content_retention_days}: production "
                    f"keeps content at least {MIN_PRODUCTION_RETENTION_DAYS} days (six months, "
                    "EU AI Act Art. 19); set LEDGER_ALLOW_SHORT_RETENTION=1 to override"
                )
            if self.checkpoint_interval == 0:
                raise ValueError(
                    "LEDGER_CHECKPOINT_INTERVAL=0 turns off signed checkpoints, which production "
                    "needs (leaves no checkpoint covers fail the audit); use a few seconds"
                )
        return self

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'ledger.db').resolve()}"

    @property
    def resolved_log_key_file(self) -> Path:
        return self.log_key_file or self.data_dir / "log-key.pem"

    @property
    def resolved_admin_token_file(self) -> Path:
        return self.admin_token_file or self.data_dir / "admin.token"
