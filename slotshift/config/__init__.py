"""The one configuration model shared by every slotshift service.

All services read the same YAML file (`deploy/local/slotshift.yaml` is the demo); each takes the
sections it needs. Models are frozen and validated on load: a bad file fails at start-up with the
offending field named, never later. Units are in the field names. Environment variables and
command-line flags are applied by the entrypoints (`slotshift_tools.cli`), never read here.

One module per concern; everything public is imported from here (`from slotshift.config import
PoolConfig`):
- base: the model base, ConfigError, the shared field types;
- tls: the TLS sections; pools: a pool and its tenants; replica_groups: a model's replicas
  sharing tenants stated once; policies: the policies' names and
  settings; preemption: pausing borrowed work; tenant_keys: the key-digest secret; services: the
  control plane's, the gateways' and the telemetry agent's sections; state_store: the control plane's state store; emulator: the vLLM emulator's; local_stack: `slotshift up`'s;
  document: the whole file;
- loading: the YAML file and its validation; overrides: `--set a.b=c`; source: the file and
  its overrides, to read again (a reload);
- paths: the one rule for file paths (a `_file` field is relative to the config file's folder);
  secrets: the one way to reveal a secret, from its value or its file.
"""

from slotshift.config.base import ConfigError, Port, PositiveSeconds
from slotshift.config.document import SlotshiftConfig
from slotshift.config.emulator import EngineSimConfig
from slotshift.config.loading import load_config, parse_config, validation_problems
from slotshift.config.local_stack import LocalStackConfig
from slotshift.config.overrides import apply_overrides, parse_overrides
from slotshift.config.paths import resolve_path, with_resolved_paths
from slotshift.config.policies import AgentPolicyConfig, PolicyName, SloPolicyConfig
from slotshift.config.pools import PoolConfig, TenantConfig
from slotshift.config.preemption import PreemptionConfig
from slotshift.config.replica_groups import ReplicaGroupConfig, divide_group, divide_slots
from slotshift.config.request_cost import PromptEstimate, RequestCostConfig
from slotshift.config.secrets import (
    read_secret_file,
    read_secret_text,
    read_secret_tokens,
    reveal,
    revealed,
)
from slotshift.config.services import (
    AgentConfig,
    AgentEngineConfig,
    ControlPlaneConfig,
    GatewayConfig,
    GpuSelector,
    ReplicaLossConfig,
    RequestLogConfig,
)
from slotshift.config.source import ConfigSource
from slotshift.config.state_store import StateStoreConfig
from slotshift.config.stream_auth import StreamAuthConfig, StreamClientIdentity
from slotshift.config.tenant_keys import TenantKeysConfig, key_digester
from slotshift.config.tls import ClientTlsConfig, ServerTlsConfig

__all__ = [
    "AgentConfig",
    "AgentEngineConfig",
    "AgentPolicyConfig",
    "ClientTlsConfig",
    "ConfigError",
    "ConfigSource",
    "ControlPlaneConfig",
    "EngineSimConfig",
    "GatewayConfig",
    "GpuSelector",
    "LocalStackConfig",
    "PolicyName",
    "PoolConfig",
    "Port",
    "PositiveSeconds",
    "PreemptionConfig",
    "PromptEstimate",
    "ReplicaGroupConfig",
    "ReplicaLossConfig",
    "RequestCostConfig",
    "RequestLogConfig",
    "ServerTlsConfig",
    "SloPolicyConfig",
    "SlotshiftConfig",
    "StateStoreConfig",
    "StreamAuthConfig",
    "StreamClientIdentity",
    "TenantConfig",
    "TenantKeysConfig",
    "apply_overrides",
    "divide_group",
    "divide_slots",
    "key_digester",
    "load_config",
    "parse_config",
    "parse_overrides",
    "read_secret_file",
    "read_secret_text",
    "read_secret_tokens",
    "resolve_path",
    "reveal",
    "revealed",
    "validation_problems",
    "with_resolved_paths",
]
