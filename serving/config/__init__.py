"""The strict config of cluster.yaml's application `args` (AppConfig) and its sections."""

from serving.config.app_config import DEFAULT_APP_NAME, AppConfig, load_cluster_yaml
from serving.config.sections import (
    ColdPool,
    ControllerSection,
    HotPool,
    LeadOverride,
    ModelSection,
    PoolsConfig,
    ReplicaSection,
    ServerSection,
    TierConfig,
)

__all__ = [
    "DEFAULT_APP_NAME",
    "AppConfig",
    "ColdPool",
    "ControllerSection",
    "HotPool",
    "LeadOverride",
    "ModelSection",
    "PoolsConfig",
    "ReplicaSection",
    "ServerSection",
    "TierConfig",
    "load_cluster_yaml",
]
