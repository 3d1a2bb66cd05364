"""``Config``: the whole file, its sections and the lookups every layer uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from vigil.config.alerting import AlertsConfig, RulesConfig
from vigil.config.base import DEFAULT_PRICES, Section
from vigil.config.cost import BudgetConfig, CostConfig
from vigil.config.dashboard import DashboardConfig
from vigil.config.engine import (
    AnomalyConfig,
    CapacityConfig,
    EngineConfig,
    ScalingConfig,
    SloConfig,
    SloDefaults,
)
from vigil.config.fleet import (
    CollectorConfig,
    DiscoveryConfig,
    PoolConfig,
    StoreConfig,
    TargetConfig,
)
from vigil.config.gateway import (
    GatewayConfig,
)
from vigil.config.otlp import OtlpConfig
from vigil.config.renamed import _migrate_renamed
from vigil.config.serve import ServeConfig
from vigil.conventions import KIND_VLLM


class Config(Section):
    """The whole configuration file."""

    store: StoreConfig = StoreConfig()
    collector: CollectorConfig = CollectorConfig()
    pools: list[PoolConfig] = []
    targets: list[TargetConfig] = []
    #: Targets found at run time (file_sd, http_sd, DNS), besides the static ``targets``.
    discovery: list[DiscoveryConfig] = []
    prices: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES)
    )
    slo_defaults: SloDefaults = SloDefaults()
    scaling: ScalingConfig = ScalingConfig()
    anomaly: AnomalyConfig = AnomalyConfig()
    engine: EngineConfig = Field(default_factory=EngineConfig)
    #: With none, every pool gets the four default SLOs (see ``effective_slos``).
    slos: list[SloConfig] = []
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)
    serve: ServeConfig = ServeConfig()
    otlp: OtlpConfig = Field(default_factory=OtlpConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    #: Monthly budgets per tenant (``[[budgets]]``).
    budgets: list[BudgetConfig] = []
    #: Where the file was read from ("" when built in code); relative store paths resolve here.
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        # Here rather than in parse_config, so that a Config built in code migrates too.
        if isinstance(data, dict):
            return _migrate_renamed(data, str(data.get("source") or ""))
        return data

    @field_validator("prices", mode="before")
    @classmethod
    def _merge_prices(cls, v: Any) -> Any:
        # A [prices] table adds to and overrides the shipped table rather than replacing it.
        if isinstance(v, dict):
            return {**DEFAULT_PRICES, **v}
        return v

    def pool(self, name: str) -> PoolConfig:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def target(self, name: str) -> TargetConfig:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(name)

    def scrape_interval(self, target: TargetConfig) -> float:
        """Seconds between scrapes of ``target``."""
        return target.scrape_interval or self.collector.scrape_interval

    def unlisted_scrape_interval(self, pool: PoolConfig) -> float | None:
        """Seconds between scrapes of the pool's replicas that no ``[[targets]]`` entry lists:
        ``pool.scrape_interval``; else the interval of the ``[[discovery]]`` entries that can
        feed the pool when they agree; else ``[collector] scrape_interval`` for a pool with a
        selector. ``None`` when unknown (several discovery intervals, or none configured for
        a pool without a selector): the cost then measures the samples' spacing."""
        if pool.scrape_interval is not None:
            return pool.scrape_interval
        if pool.selector:
            # A selector pool's replicas are the team's scrape jobs', never a discovery's.
            return self.collector.scrape_interval
        found = {d.scrape_interval or self.collector.scrape_interval for d in self.discovery
                 if d.pool in (pool.name, "") and d.kind == KIND_VLLM}
        if len(found) == 1:
            return found.pop()
        return None

    def scrape_timeout(self, target: TargetConfig) -> float:
        """Seconds a scrape of ``target`` may take: its own timeout, or the default capped to
        its interval (as Prometheus does for a job that sets only its interval)."""
        timeout = target.scrape_timeout or self.collector.scrape_timeout
        return min(timeout, self.scrape_interval(target))

    def config_dir(self) -> Path | None:
        """The folder of the config file, where its relative paths point (None when the
        config was built in code)."""
        return Path(self.source).resolve().parent if self.source else None

    def outbox_path(self) -> Path:
        """The alert outbox's path; a relative path is relative to the config file's folder."""
        p = Path(self.alerts.outbox_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def outbox_target(self) -> str | Path:
        """Where the alert outbox lives: the ``[serve] database`` URL that several copies of
        `vigil serve` share when set, else the SQLite file ``outbox_path()``."""
        return self.serve.database or self.outbox_path()

    def gateway_database(self) -> str | Path:
        """Where the gateway keeps its shared state: the ``[gateway] database`` URL when set,
        else the SQLite file ``gateway_records_path()``."""
        return self.gateway.database or self.gateway_records_path()

    def gateway_records_path(self) -> Path:
        """The gateway's records database; a relative path is relative to the config file."""
        p = Path(self.gateway.records_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def cost_statements_path(self) -> Path:
        """The frozen months' file; a relative path is relative to the config file."""
        p = Path(self.cost.statements_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def known_tenants(self) -> list[str]:
        """Every tenant the config names: the gateway's API keys' and ``[cost] tenants``."""
        return sorted({k.tenant for k in self.gateway.api_keys} | set(self.cost.tenants))

    def capacity_profiles_path(self) -> Path:
        """The saved capacity profiles; a relative path is relative to the config file."""
        p = Path(self.capacity.profiles_path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

    def store_path(self) -> Path:
        """The store's path; a relative path is relative to the config file's folder."""
        p = Path(self.store.path)
        if not p.is_absolute() and self.source:
            p = Path(self.source).resolve().parent / p
        return p

