"""Reading a config file: TOML, renamed keys, validation and the checks across sections,
with errors that name the file and the dotted key."""

from __future__ import annotations

import logging
import re
import tomllib
import warnings
from pathlib import Path
from typing import Any

from pydantic import (
    ValidationError,
)

from vigil.config.engine import BurnRateAlert
from vigil.config.renamed import RENAMED_KEYS
from vigil.config.root import Config
from vigil.conventions import TARGET_KINDS
from vigil.errors import ConfigError

_log = logging.getLogger("vigil.config")


def _moved_key(key: str, data: dict[str, Any]) -> str:
    """An error's dotted ``key`` as the file spelt it: the old name of a renamed key."""
    for (old_section, old_key), (new_section, new_key) in RENAMED_KEYS.items():
        new = f"{new_section}.{new_key}"
        old_table = data.get(old_section)
        if (key == new or key.startswith(new + ".")) and isinstance(old_table, dict) \
                and old_key in old_table:
            return f"{old_section}.{old_key}" + key[len(new):]
    return key


Problem = tuple[str, str]  # (dotted key, message)


def _duplicate(names: list[str], i: int, key: str, what: str, *,
               quote: bool = True) -> list[Problem]:
    """A problem at ``key`` when entry ``i``'s name, ``names[i]``, an earlier entry has;
    ``quote=False`` leaves the value out of the message (a key's hash)."""
    if names.index(names[i]) == i:
        return []
    return [(key, f"duplicate {what} {names[i]!r}" if quote else f"duplicate {what}")]


def _unknown_pool(name: str, key: str, pool_names: list[str]) -> list[Problem]:
    """A problem at ``key`` when ``name`` is no configured pool."""
    if name in pool_names:
        return []
    known = ", ".join(repr(n) for n in pool_names) or "none defined"
    return [(key, f"pool {name!r} does not exist (pools: {known})")]


def _check_references(cfg: Config) -> list[Problem]:
    """Cross-field checks pydantic cannot express: (dotted key, message) pairs, in the order
    of the file's sections."""
    problems: list[Problem] = []
    pool_names = [p.name for p in cfg.pools]
    for i, p in enumerate(cfg.pools):
        problems += _duplicate(pool_names, i, f"pools[{i}].name", "pool name")
        if p.gpu not in cfg.prices:
            known = ", ".join(sorted(cfg.prices))
            problems.append(
                (f"pools[{i}].gpu", f"no price for GPU {p.gpu!r}: add it to [prices] "
                 f"(known: {known})")
            )
    slo_names = [x.name for x in cfg.slos]
    for i, slo in enumerate(cfg.slos):
        problems += _duplicate(slo_names, i, f"slos[{i}].name", "SLO name")
        problems += _unknown_pool(slo.pool, f"slos[{i}].pool", pool_names)
        latency = slo.indicator in ("ttft", "e2e")
        if slo.threshold_seconds is not None and not latency:
            problems.append((f"slos[{i}].threshold_seconds",
                             f"only latency indicators (ttft, e2e) take a threshold, "
                             f"not {slo.indicator!r}"))
    key_hashes = [k.sha256 for k in cfg.gateway.api_keys]
    for i in range(len(key_hashes)):
        problems += _duplicate(key_hashes, i, f"gateway.api_keys[{i}].sha256", "API key hash",
                               quote=False)
    for i, name in enumerate(cfg.gateway.cache.pools):
        problems += _unknown_pool(name, f"gateway.cache.pools[{i}]", pool_names)
    route_names = [r.name for r in cfg.alerts.routes]
    for i in range(len(route_names)):
        problems += _duplicate(route_names, i, f"alerts.routes[{i}].name", "route name")
    lease = cfg.serve.lease_duration
    for i, r in enumerate(cfg.alerts.routes):
        # The leader starts an attempt only while its lease outlasts the attempt's timeout
        # (alerts.leadership): a longer timeout would never be sent.
        if cfg.serve.database and r.timeout > lease / 2:
            problems.append((f"alerts.routes[{i}].timeout",
                             f"{r.timeout:g}s is more than half of [serve] lease_duration "
                             f"({lease:g}s): copies sharing a database send an alert only "
                             "while the leader's lease outlasts the request; shorten the "
                             "timeout or lengthen the lease"))
    target_names = [t.name for t in cfg.targets]
    for i, t in enumerate(cfg.targets):
        problems += _duplicate(target_names, i, f"targets[{i}].name", "target name")
        problems += _unknown_pool(t.pool, f"targets[{i}].pool", pool_names)
        if t.kind not in TARGET_KINDS:  # pragma: no cover - Literal already enforces it
            problems.append((f"targets[{i}].kind", f"unknown kind {t.kind!r}"))
        for field in ("scrape_interval", "scrape_timeout"):
            v = getattr(t, field)
            if v is not None and v <= 0:
                problems.append((f"targets[{i}].{field}", "must be more than 0 seconds"))
        # As Prometheus: an inherited timeout is capped to the interval, an explicit one that
        # exceeds it is an error.
        if t.scrape_timeout is not None and t.scrape_timeout > cfg.scrape_interval(t):
            problems.append((f"targets[{i}].scrape_timeout",
                             f"{t.scrape_timeout:g}s is more than the target's scrape "
                             f"interval ({cfg.scrape_interval(t):g}s)"))
    discovery_names = [d.name for d in cfg.discovery]
    for i, d in enumerate(cfg.discovery):
        problems += _duplicate(discovery_names, i, f"discovery[{i}].name", "discovery name")
        if d.pool:
            problems += _unknown_pool(d.pool, f"discovery[{i}].pool", pool_names)
        if d.scrape_timeout is not None and d.scrape_timeout > (
                d.scrape_interval or cfg.collector.scrape_interval):
            problems.append((f"discovery[{i}].scrape_timeout",
                             "is more than the targets' scrape interval"))
    problems += _check_cost(cfg, pool_names)
    return problems


def _check_cost(cfg: Config, pool_names: list[str]) -> list[Problem]:
    """``[[cost.prices]]`` name pools; ``[[budgets]]`` name known tenants, pools, and each
    budget once."""
    problems: list[Problem] = []
    for i, price in enumerate(cfg.cost.prices):
        problems += _unknown_pool(price.pool, f"cost.prices[{i}].pool", pool_names)
    tenants = cfg.known_tenants()
    names = [b.display_name() for b in cfg.budgets]
    for i, b in enumerate(cfg.budgets):
        problems += _duplicate(names, i, f"budgets[{i}].name", "budget")
        if b.tenant not in tenants:
            known = ", ".join(repr(t) for t in tenants) or "none"
            problems.append((f"budgets[{i}].tenant",
                             f"tenant {b.tenant!r} is in no [[gateway.api_keys]] and not in "
                             f"[cost] tenants (known: {known})"))
        if b.pool:
            problems += _unknown_pool(b.pool, f"budgets[{i}].pool", pool_names)
    return problems


def _loc(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a dotted TOML key path: ``targets[2].pool``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(
            ("function-", "literal[")
        ):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


#: A URL's password (``scheme://user:PASSWORD@``) or a ``password=`` parameter.
_URL_PASSWORD = re.compile(r"(://[^/@:\s'\"]*):[^@/\s'\"]*@|(\bpassword=)[^&\s'\"]*")


def _shown(value: Any) -> str:
    """``repr(value)`` as an error may show it: passwords in URLs masked, since a secret
    never appears in an error (even one the config should not have held)."""
    return _URL_PASSWORD.sub(lambda m: f"{m[1]}:***@" if m[1] else f"{m[2]}***", repr(value))


def parse_config(data: dict[str, Any], *, file: str = "<config>") -> Config:
    """Validate a parsed TOML document; raise ``ConfigError`` naming the file and key."""
    data = dict(data)
    if "source" in data:
        raise ConfigError("unknown key", file=file, key="source")
    try:
        cfg = Config.model_validate({**data, "source": file if file != "<config>" else ""})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = _moved_key(_loc(err["loc"]), data)
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check the spelling; see vigil.example.toml)"
            else:
                msg = err["msg"]
                if msg.startswith("Value error, "):
                    msg = msg[len("Value error, "):]
                if "input" in err and err["type"] != "missing" and repr(err["input"]) not in msg:
                    msg += f" (got {_shown(err['input'])})"
            problems.append((key, msg))
        raise _many(problems, file) from None
    problems = _check_references(cfg)
    if problems:
        raise _many(problems, file)
    _warn_availability_changed(cfg, file)
    return cfg


def _warn_availability_changed(cfg: Config, file: str) -> None:
    """A ``DeprecationWarning`` (also logged) per SLO that names ``availability``: its meaning
    changed from scrapes to requests, and ``replica_up`` is the old figure."""
    for i, slo in enumerate(cfg.slos):
        if slo.indicator != "availability":
            continue
        message = (f"{file}: slos[{i}] ({slo.name!r}): indicator \"availability\" now measures "
                   "requests (the share answered without a server error: 5xx, refused or reset "
                   "connections, timeouts), no longer scrapes; for the share of scrape time the "
                   "replicas were up (the old figure) use indicator = \"replica_up\"")
        _log.warning("%s", message)
        warnings.warn(message, DeprecationWarning, stacklevel=3)


def _many(problems: list[tuple[str, str]], file: str) -> ConfigError:
    key, msg = problems[0]
    if len(problems) > 1:
        more = "; ".join(f"{k}: {m}" for k, m in problems[1:])
        msg = f"{msg} (and {len(problems) - 1} more: {more})"
    return ConfigError(msg, file=file, key=key)


def _read_toml(p: Path) -> dict[str, Any]:
    """A TOML file's document; ``ConfigError`` naming the file when it cannot be read."""
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(p)) from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason})", file=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=str(p)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file.

    Raises ``ConfigError`` (exit code 2) for a missing file, bad TOML, unknown keys, wrong
    types or broken references, naming the file and the key.
    """
    p = Path(path)
    return parse_config(_read_toml(p), file=str(p))


def load_alert_table(path: str | Path) -> list[BurnRateAlert]:
    """The burn-rate alert table of a TOML file: ``[[engine.burn_rate_alerts]]`` rows, as a
    config spells them, or ``[[alerts]]`` rows, as ``slo/burn_rate_windows.toml`` does.
    ``ConfigError`` naming the file and the row's key when a row is wrong."""
    p = Path(path)
    data = _read_toml(p)
    engine = data.get("engine")
    if isinstance(engine, dict) and "burn_rate_alerts" in engine:
        key, rows = "engine.burn_rate_alerts", engine["burn_rate_alerts"]
    elif "alerts" in data:
        key, rows = "alerts", data["alerts"]
    else:
        raise ConfigError("no alert table: give [[engine.burn_rate_alerts]] or [[alerts]] "
                          "rows", file=str(p))
    if not isinstance(rows, list) or not rows:
        raise ConfigError("expected at least one [[...]] row", file=str(p), key=key)
    table = []
    for index, row in enumerate(rows):
        try:
            table.append(BurnRateAlert.model_validate(row))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = _loc(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key (check the spelling; see vigil.example.toml)"
            raise ConfigError(msg, file=str(p),
                              key=f"{key}[{index}]" + ("" if where == "(top level)"
                                                      else f".{where}")) from None
    return table
