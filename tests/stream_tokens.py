"""Stream tokens for the tests' stacks: the control plane refuses to start without stream
credentials (controlplane.stream_auth), so every stack a test starts gets a gateway token and an
agent token, written as files, and the config that names them on all three sides."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotshift.config import SlotshiftConfig


@dataclass(frozen=True)
class StreamTokens:
    """A gateway token and an agent token (random), and the files that hold them."""

    gateway_token: str
    agent_token: str
    gateway_file: Path
    agent_file: Path

    @classmethod
    def write(cls, folder: Path) -> StreamTokens:
        """Fresh tokens, written to `folder` (made if missing)."""
        folder.mkdir(parents=True, exist_ok=True)
        gateway, agent = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        gateway_file, agent_file = folder / "gateway-stream-token", folder / "agent-stream-token"
        gateway_file.write_text(gateway + "\n", encoding="utf-8")
        agent_file.write_text(agent + "\n", encoding="utf-8")
        return cls(gateway, agent, gateway_file, agent_file)

    @classmethod
    def for_stack(cls, exits: AsyncExitStack) -> StreamTokens:
        """Fresh tokens in a temporary folder that `exits` removes."""
        folder = Path(tempfile.mkdtemp(prefix="slotshift-stream-tokens-"))
        exits.callback(shutil.rmtree, folder, ignore_errors=True)
        return cls.write(folder)

    @property
    def gateway_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata a gateway presents its token in."""
        return (("authorization", f"Bearer {self.gateway_token}"),)

    @property
    def agent_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata an agent presents its token in."""
        return (("authorization", f"Bearer {self.agent_token}"),)

    def settings(self) -> dict[str, Any]:
        """The dotted overrides (apply_overrides, `--set`) that name the token files."""
        return {
            "controlplane.stream_auth.gateway_token_file": str(self.gateway_file),
            "controlplane.stream_auth.agent_token_file": str(self.agent_file),
            "gateway.controlplane_token_file": str(self.gateway_file),
            "agent.controlplane_token_file": str(self.agent_file),
        }

    def add_to(self, document: dict[str, Any]) -> dict[str, Any]:
        """A config document (a dict as parse_config takes it) with the token files added to
        its controlplane, gateway and agent sections; one whose control plane sets stream_auth
        already is returned as it is."""
        controlplane = dict(document.get("controlplane") or {})
        if "stream_auth" in controlplane:
            return document
        controlplane["stream_auth"] = {
            "gateway_token_file": str(self.gateway_file),
            "agent_token_file": str(self.agent_file),
        }
        gateway = {
            **(document.get("gateway") or {}),
            "controlplane_token_file": str(self.gateway_file),
        }
        agent = {**(document.get("agent") or {}), "controlplane_token_file": str(self.agent_file)}
        return {**document, "controlplane": controlplane, "gateway": gateway, "agent": agent}

    def apply(self, config: SlotshiftConfig) -> SlotshiftConfig:
        """`config` with the token files named on all three sides; one whose control plane
        configures stream_auth already (a test of its own credentials) is returned as it is."""
        auth = config.controlplane.stream_auth
        if auth.configures("gateway") or auth.configures("agent"):
            return config
        if auth.insecure_allow_unauthenticated:
            return config
        controlplane = config.controlplane.model_copy(
            update={
                "stream_auth": auth.model_copy(
                    update={
                        "gateway_token_file": str(self.gateway_file),
                        "agent_token_file": str(self.agent_file),
                    }
                )
            }
        )
        return config.model_copy(
            update={
                "controlplane": controlplane,
                "gateway": config.gateway.model_copy(
                    update={"controlplane_token_file": str(self.gateway_file)}
                ),
                "agent": config.agent.model_copy(
                    update={"controlplane_token_file": str(self.agent_file)}
                ),
            }
        )
