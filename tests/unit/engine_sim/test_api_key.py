"""engine_sim.api_key_file: the emulator guards its API routes as vLLM 0.32 does with --api-key
(vllm/entrypoints/serve/middleware/authenticate.py): /v1/... needs `Authorization: Bearer KEY`
with one of the keys, else 401 `{"error":"Unauthorized"}`; the other paths stay open."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from engine_sim.server import EngineSim, api_key_middleware
from slotshift.config import ConfigError, EngineSimConfig
from tests.unit.engine_sim.conftest import MODEL, fast_config

KEY = "sk-engine-sim-key-5e0b"
SECOND_KEY = "sk-engine-sim-next-key-a71c"
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}


@pytest.fixture
def sim_config(tmp_path: Path) -> EngineSimConfig:
    key_file = tmp_path / "engine-api-key"
    # Two keys, as vLLM takes several --api-key values (a rotation holds both for a while).
    key_file.write_text(f"# keys\n{KEY}\n\n  {SECOND_KEY}  \n")
    return fast_config(api_key_file=str(key_file))


async def _status(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    authorization: str | None,
    body: object | None = None,
) -> tuple[int, bytes]:
    headers = {} if authorization is None else {"Authorization": authorization}
    async with http.request(method, url, json=body, headers=headers) as response:
        return response.status, await response.read()


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="none"),
        pytest.param("", id="empty"),
        pytest.param("Bearer sk-wrong", id="wrong-key"),
        pytest.param(f"Basic {KEY}", id="other-scheme"),
        pytest.param(f"Bearer {KEY} extra", id="key-and-more"),
        pytest.param(f"Bearer{KEY}", id="no-space"),
    ],
)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("POST", "/v1/completions", COMPLETION, id="completions"),
        pytest.param(
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            id="chat",
        ),
        pytest.param("GET", "/v1/models", None, id="models"),
        # Guarded whether or not a route exists there, as vLLM's middleware runs first.
        pytest.param("GET", "/v1/nothing", None, id="unknown"),
    ],
)
async def test_the_api_routes_refuse_a_request_without_a_valid_key_as_vllm_does(
    sim: EngineSim,
    http: aiohttp.ClientSession,
    authorization: str | None,
    method: str,
    path: str,
    body: object | None,
) -> None:
    status, content = await _status(http, method, sim.url + path, authorization, body)
    assert (status, content) == (401, b'{"error":"Unauthorized"}')
    assert sim.engine.core.num_running + sim.engine.core.num_waiting == 0


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {SECOND_KEY}"],
)
async def test_any_of_the_keys_in_the_bearer_scheme_is_let_through(
    sim: EngineSim, http: aiohttp.ClientSession, authorization: str
) -> None:
    status, _ = await _status(http, "POST", sim.url + "/v1/completions", authorization, COMPLETION)
    assert status == 200
    assert (await _status(http, "GET", sim.url + "/v1/models", authorization))[0] == 200
    assert sim.completed_count == 1


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param("GET", "/health", None, id="health"),
        pytest.param("GET", "/metrics", None, id="metrics"),
        pytest.param("GET", "/version", None, id="version"),
        # vLLM 0.32 guards only /v1, /v2, /inference and /cohere: /tokenize is open there.
        pytest.param("POST", "/tokenize", {"model": MODEL, "prompt": "Hi"}, id="tokenize"),
        pytest.param("POST", "/sim/reset-peak", None, id="sim-control"),
    ],
)
async def test_the_other_paths_stay_open(
    sim: EngineSim, http: aiohttp.ClientSession, method: str, path: str, body: object | None
) -> None:
    assert (await _status(http, method, sim.url + path, None, body))[0] == 200


def test_a_middleware_needs_a_key() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        api_key_middleware([])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("\n# none here\n", "holds no token", id="no-key"),
        pytest.param(None, "cannot read", id="missing"),
    ],
)
async def test_an_emulator_whose_key_file_holds_no_key_does_not_start(
    tmp_path: Path, content: str | None, message: str
) -> None:
    key_file = tmp_path / "engine-api-key"
    if content is not None:
        key_file.write_text(content)
    emulator = EngineSim(fast_config(api_key_file=str(key_file)))
    with pytest.raises(ConfigError, match=f"engine_sim.api_key_file: .*{message}"):
        await emulator.start()
    # Nothing was started that would need stopping.
    await emulator.stop()
