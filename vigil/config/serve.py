"""`vigil serve` in several copies (``[serve]``): the shared database and the leader's lease."""

from __future__ import annotations

from pydantic import Field, model_validator

from vigil.config.base import Duration, Section, refuse_password


class ServeConfig(Section):
    """How copies of `vigil serve` share one voice.

    One copy (the default) keeps its alert outbox in the SQLite file ``[alerts] outbox_path``.
    With ``database``, every copy keeps the outbox there and takes a lease: the leader alone
    queues and delivers notifications, the others evaluate and stand by, and one of them takes
    over within ``lease_duration`` when the leader dies. Copies that forward to Alertmanager's
    API need none of this: Alertmanager deduplicates what several senders post.
    """

    #: ``postgresql://user@host:port/dbname`` shared by every copy: the alert outbox and the
    #: leader's lease ("" = one copy, the SQLite outbox). Put the password in ``PGPASSWORD``
    #: or ``~/.pgpass`` (libpq reads both), not in the config file.
    database: str = Field(default="", pattern=r"^(|postgres(ql)?://\S*)$")
    #: How long a leader's lease lasts without renewal (seconds): the longest a dead leader's
    #: alerts wait for another copy. Renewed every second. Every route's ``timeout`` must be
    #: at most half of it: the leader starts a request only while its lease outlasts it.
    lease_duration: Duration = Field(default=30.0, ge=3.0, le=600.0)
    #: This copy's name in the lease, ``/healthz`` and ``/metrics`` ("" = host name and
    #: process id). Two copies must never share a name.
    name: str = Field(default="", pattern=r"^[A-Za-z0-9_.:@-]*$", max_length=200)

    @model_validator(mode="after")
    def _no_password(self) -> ServeConfig:
        refuse_password(self.database, "database: the URL", "put it in PGPASSWORD or ~/.pgpass "
                        "(libpq reads both) so it never sits in the config")
        return self
