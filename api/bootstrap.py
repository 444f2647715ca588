"""First-start preparation: the ledger's own key and, on the embedded default, an admin token.

Called by the CLI after migrations and before the app is built. Everything that can refuse
the start is checked before anything is created, so a refused start leaves no file behind:

1. production: an existing log key file must be private (``secretfile.check_private_file``:
   mode 0600 or stricter, this user's, in a directory others cannot write), a new one's
   directory must be safe; and an API token must already exist (none is written);
2. a missing log key file for a log that already has leaves is refused (a new key would fork
   the log's trust anchor);
3. development with no token: the admin token is validated and staged (its file must not
   exist yet) before the key is created.

Then the key pair is written (0600/0644, atomic, exclusive), registered, and the admin token
stored and its file published. Files this start created are removed again if a later step
refuses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from api.settings import Settings
from ledger import secretfile
from ledger.errors import Conflict, InvalidInput
from ledger.signing import SigningKey, public_key_pem
from ledger.storage import keystore, log, tokenstore
from ledger.storage.database import Database

LOG_KEY_SETTING = "LEDGER_LOG_KEY_FILE"


@dataclass(frozen=True)
class Bootstrapped:
    log_key: SigningKey
    admin_token_file: Path | None  # set when this start wrote a new admin token


def _load_key(path: Path) -> SigningKey:
    try:
        return SigningKey.load(path)
    except InvalidInput as exc:
        if exc.code == "invalid_private_key":
            raise
        raise InvalidInput(
            f"{LOG_KEY_SETTING}: {exc.message}", code="log_key_unreadable", details=exc.details
        ) from exc


def _create_key(path: Path) -> tuple[SigningKey, list[secretfile.StagedSecret]]:
    """A new key pair at ``path`` (and ``.pub.pem``); returns the published files for undo.
    Another process that created the key first wins: its key is used."""
    key = SigningKey.generate()
    public = path.with_suffix(".pub.pem")
    staged: list[secretfile.StagedSecret] = []
    try:
        staged.append(secretfile.stage_secret_file(path, key.private_pem()))
        pem = public_key_pem(key.public_key)
        staged.append(secretfile.stage_secret_file(public, pem, mode=secretfile.PUBLIC_MODE))
        for item in staged:
            item.publish()
    except secretfile.SecretFileExists:
        for item in staged:
            item.discard()
        if os.path.lexists(path) and not os.path.islink(path):
            return _load_key(path), []  # lost a race to another process starting
        raise
    except BaseException:
        for item in staged:
            item.discard()
        raise
    return key, staged


def preflight(settings: Settings, db: Database) -> None:
    """Refuse a start that production mode does not allow; creates nothing."""
    if settings.environment != "production":
        return
    key_path = settings.resolved_log_key_file
    if os.path.lexists(key_path):
        secretfile.check_private_file(key_path, setting=LOG_KEY_SETTING)
    else:
        secretfile.check_private_location(key_path, setting=LOG_KEY_SETTING)
    if tokenstore.count_tokens(db) == 0:
        raise InvalidInput(
            "no API tokens exist; create one with `ledger tokens create --scope admin`",
            code="no_tokens",
        )


def bootstrap(settings: Settings, db: Database) -> Bootstrapped:
    preflight(settings, db)
    key_path = settings.resolved_log_key_file
    key_exists = os.path.lexists(key_path)
    if not key_exists:
        with db.read() as s:
            leaves = log.log_size(s)
        if leaves:
            raise InvalidInput(
                f"{LOG_KEY_SETTING}={key_path} does not exist, but this database's log already "
                f"has {leaves} leaves signed by its log key; point {LOG_KEY_SETTING} at that key "
                "(a new key would fork the log)",
                code="log_key_missing",
            )
    admin: tokenstore.NewToken | None = None
    staged_admin: secretfile.StagedSecret | None = None
    created: list[secretfile.StagedSecret] = []
    if settings.environment != "production":
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if tokenstore.count_tokens(db) == 0:
            admin = tokenstore.prepare_token("bootstrap-admin", ["admin"])
            path = settings.resolved_admin_token_file
            try:
                staged_admin = secretfile.stage_secret_file(path, admin.secret + "\n")
            except secretfile.SecretFileExists as exc:
                raise secretfile.SecretFileExists(
                    f"{exc.message} (no API token exists in this database, so the file is "
                    "stale: remove it, or set LEDGER_ADMIN_TOKEN_FILE elsewhere)",
                    details=exc.details,
                ) from exc
    try:
        if key_exists:
            log_key = _load_key(key_path)
        else:
            log_key, created = _create_key(key_path)
        try:
            keystore.ensure_log_key(db, log_key)
        except Conflict:
            for item in created:  # this start's new key is not the log's: leave nothing behind
                item.discard()
            raise
        if admin is not None and staged_admin is not None:
            tokenstore.store_token(db, admin)
            try:
                staged_admin.publish()
            except BaseException:
                tokenstore.delete_token(db, admin.info.token_id)
                raise
            return Bootstrapped(log_key, staged_admin.path)
        return Bootstrapped(log_key, None)
    finally:
        if staged_admin is not None and not staged_admin.published:
            staged_admin.discard()
