"""First-start preparation: the ledger's own key and, on the embedded default, an admin token.

Called by the CLI after migrations and before the app is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from api.settings import Settings
from ledger.errors import InvalidInput
from ledger.signing import SigningKey
from ledger.storage import keystore, tokenstore
from ledger.storage.database import Database


@dataclass(frozen=True)
class Bootstrapped:
    log_key: SigningKey
    admin_token_file: Path | None  # set when this start wrote a new admin token


def load_or_create_log_key(path: Path) -> SigningKey:
    if path.exists():
        return SigningKey.load(path)
    key = SigningKey.generate()
    try:
        key.write(path, path.with_suffix(".pub.pem"))
    except FileExistsError:  # another process won the race: use its key
        return SigningKey.load(path)
    return key


def write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")


def bootstrap(settings: Settings, db: Database) -> Bootstrapped:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log_key = load_or_create_log_key(settings.resolved_log_key_file)
    keystore.ensure_log_key(db, log_key)
    written = None
    if tokenstore.count_tokens(db) == 0:
        if settings.environment == "production":
            raise InvalidInput(
                "no API tokens exist; create one with `ledger tokens create --scope admin`",
                code="no_tokens",
            )
        secret, _ = tokenstore.create_token(db, "bootstrap-admin", ["admin"])
        written = settings.resolved_admin_token_file
        write_secret(written, secret)
    return Bootstrapped(log_key, written)
