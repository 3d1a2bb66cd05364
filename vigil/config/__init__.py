"""Vigil's configuration: one TOML file, validated with pydantic.

Every threshold, window and interval the rest of Vigil uses is a default here, never a constant
in code. Unknown keys, wrong types and broken references fail loudly with the file and the
dotted key path (``ConfigError``, exit code 2). A renamed key (``RENAMED_KEYS``) still loads,
with a ``DeprecationWarning`` (also logged) that names the file, the old key and the new one.

The models are grouped by who owns the keys: ``fleet`` (store, collector, pools, targets,
discovery), ``engine`` (SLOs, burn-rate alerts, anomalies, scaling, capacity), ``alerting``
(routes, rules, KEDA), ``gateway``, ``dashboard``, ``cost`` (attribution, prices over time,
budgets); ``root`` holds ``Config`` and ``load`` reads and checks a file. Everything is
imported from ``vigil.config``.
"""

from vigil.config.alerting import AlertRouteConfig, AlertsConfig, KedaConfig, RulesConfig
from vigil.config.base import DEFAULT_PRICES, check_http_url
from vigil.config.cost import BudgetConfig, CostConfig, PriceConfig
from vigil.config.dashboard import DashboardConfig
from vigil.config.engine import (
    AnomalyConfig,
    BurnRateAlert,
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
    VllmProfileConfig,
)
from vigil.config.gateway import (
    ApiKeyConfig,
    BatchConfig,
    CacheConfig,
    GatewayConfig,
    TierConfig,
    TiersConfig,
)
from vigil.config.http import BasicAuthConfig, HttpClientConfig, OAuth2Config, TlsConfig
from vigil.config.load import load_alert_table, load_config, parse_config
from vigil.config.otlp import OtlpConfig
from vigil.config.renamed import RENAMED_KEYS
from vigil.config.root import Config
from vigil.config.serve import ServeConfig

__all__ = [
    "DEFAULT_PRICES",
    "RENAMED_KEYS",
    "AlertRouteConfig",
    "AlertsConfig",
    "AnomalyConfig",
    "ApiKeyConfig",
    "BasicAuthConfig",
    "BatchConfig",
    "BudgetConfig",
    "BurnRateAlert",
    "CacheConfig",
    "CapacityConfig",
    "CollectorConfig",
    "Config",
    "CostConfig",
    "DashboardConfig",
    "DiscoveryConfig",
    "EngineConfig",
    "GatewayConfig",
    "HttpClientConfig",
    "KedaConfig",
    "OAuth2Config",
    "OtlpConfig",
    "PoolConfig",
    "PriceConfig",
    "RulesConfig",
    "ScalingConfig",
    "ServeConfig",
    "SloConfig",
    "SloDefaults",
    "StoreConfig",
    "TargetConfig",
    "TierConfig",
    "TiersConfig",
    "TlsConfig",
    "VllmProfileConfig",
    "check_http_url",
    "load_alert_table",
    "load_config",
    "parse_config",
]
