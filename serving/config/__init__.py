"""The strict config of cluster.yaml's application `args` (AppConfig) and its sections.

A leaf of serving/: it imports, from this repository, only common/ and the two modules that
themselves import nothing from serving/ (serving/model_source.py for the embedded model's name,
serving/engine/config.py for EngineConfig, the engine's own config). The packages above
(llm, embed, batch, the app) read their sections from here; tests/unit/repo/test_import_graph.py
keeps it so.

    app_config.py        AppConfig: the whole `args`, strict keys, renamed keys, fingerprint
    model.py             model: the model, its served name, its LoRA adapters
    sections.py          tiers, pools, replica, server, controller
    batch_api.py         batch_api: the Batch API (/v1/files, /v1/batches; serving/batch/)
    dynamic_batching.py  dynamic_batching: an embedding app's request batcher (serving/embed/)
    front_door.py        the ingress's bounds derived from the config
"""

from serving.config.app_config import DEFAULT_APP_NAME, AppConfig, load_cluster_yaml
from serving.config.batch_api import BatchApiSection
from serving.config.dynamic_batching import DynamicBatchingSection
from serving.config.model import ModelSection
from serving.config.sections import (
    ColdPool,
    ControllerSection,
    HotPool,
    LeadOverride,
    PoolsConfig,
    ReplicaSection,
    ServerSection,
    TierConfig,
)

__all__ = [
    "DEFAULT_APP_NAME",
    "AppConfig",
    "BatchApiSection",
    "ColdPool",
    "ControllerSection",
    "DynamicBatchingSection",
    "HotPool",
    "LeadOverride",
    "ModelSection",
    "PoolsConfig",
    "ReplicaSection",
    "ServerSection",
    "TierConfig",
    "load_cluster_yaml",
]
