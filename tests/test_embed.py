"""Embedders: offline operation, paraphrase ranking, determinism, the OpenAI-compatible client."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import numpy as np
import pytest

from ctxwarden.embed import (
    Embedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    StaticEmbedder,
    get_embedder,
)
from ctxwarden.errors import ConfigError, EmbedError, UpstreamError

# Held-out pairs (bench/embed_choice.py tuned on different ones): a statement and a later
# question about it in other words.
PAIRS = [
    ("My brother is getting married in Kyoto next April.", "Where is my sibling's wedding?"),
    ("The staging server's certificate expired on Sunday.", "Why is HTTPS broken on the test env?"),
    ("I'm lactose intolerant, so no milk or cheese for me.", "Which dairy products can't I eat?"),
    ("Our cat knocked the vase off the shelf this morning.", "What did the pet break today?"),
    ("The marketing budget was cut by a third.", "How much less money does advertising get?"),
    ("I finally finished reading War and Peace.", "Which long novel did I complete?"),
    ("The backup job runs every night at two a.m.", "When are the nightly snapshots taken?"),
    ("My dentist appointment got moved to Thursday.", "When do I see the tooth doctor?"),
    (
        "We hired a contractor to fix the leaking roof.",
        "Who is repairing the water damage upstairs?",
    ),
    (
        "The search endpoint times out on queries longer than 500 characters.",
        "Why do long lookups fail on the API?",
    ),
    ("I bought a second-hand road bike for commuting.", "How do I get to work these days?"),
    ("Maria is leading the mobile app redesign.", "Who owns the new phone UI project?"),
    (
        "The heating in the flat broke during the cold snap.",
        "What stopped working in the apartment?",
    ),
    (
        "We're going camping in the Scottish Highlands in August.",
        "What are our summer holiday plans?",
    ),
    (
        "The unit tests are flaky because they depend on the system clock.",
        "Why do some checks fail randomly?",
    ),
    ("I'm training for a triathlon in the autumn.", "What sports event am I preparing for?"),
    (
        "The client wants the proposal in Spanish as well.",
        "Which translation did the customer request?",
    ),
    ("Dad's hip surgery went well and he's home now.", "How is my father recovering?"),
    (
        "Our internet provider doubles the price next year.",
        "What's happening to the broadband bill?",
    ),
    ("I planted apple and pear trees in the garden.", "What fruit am I growing at home?"),
    (
        "The conference talk about vector search got accepted.",
        "Did my presentation proposal make it in?",
    ),
    ("Kenji speaks Japanese, English and a little Korean.", "Which languages does Kenji know?"),
    (
        "The kitchen renovation will take six more weeks.",
        "How long until the cooking area is finished?",
    ),
    ("I gave up coffee and drink green tea instead.", "What's my morning drink now?"),
    (
        "The payment service rejects cards issued outside the EU.",
        "Why can't American customers check out?",
    ),
]
UNRELATED = [
    "The mitochondria is the powerhouse of the cell.",
    "Shuffle the deck and deal seven cards to each player.",
    "The Nile flows north into the Mediterranean.",
    "Use a semicolon to separate independent clauses.",
    "Penguins cannot fly but swim very well.",
    "The orchestra tuned to the oboe's A.",
    "Saturn's rings are made mostly of ice.",
    "OK, sounds good.",
    "Fold the egg whites gently into the batter.",
    "The goalkeeper saved a penalty in extra time.",
]


def _ranking(embedder: Embedder) -> tuple[float, float]:
    """(share of questions whose own statement ranks first, pairwise win share)."""
    questions = embedder.embed([q for _, q in PAIRS])
    corpus = embedder.embed([s for s, _ in PAIRS] + UNRELATED)
    sims = questions @ corpus.T
    top1 = float(np.mean([int(np.argmax(sims[i])) == i for i in range(len(PAIRS))]))
    wins = [float(np.mean(np.delete(sims[i], i) < sims[i, i])) for i in range(len(PAIRS))]
    return top1, float(np.mean(wins))


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def static() -> StaticEmbedder:
    return StaticEmbedder()


def test_protocol_and_shapes(minilm: MiniLMEmbedder, static: StaticEmbedder) -> None:
    for embedder, dim in ((minilm, 384), (static, 256)):
        assert isinstance(embedder, Embedder)
        assert embedder.dim == dim
        assert embedder.embed([]).shape == (0, dim)
        out = embedder.embed(["hello there", "", "a much longer message " * 50])
        assert out.shape == (3, dim)
        assert out.dtype == np.float32
        norms = np.linalg.norm(out, axis=1)
        # An empty text has no tokens in the static model: it stays the zero vector.
        assert np.allclose(norms[[0, 2]], 1.0, atol=1e-5)
    assert minilm.name == "minilm-l6-int8@2"
    assert static.name == "minilm-l6-static@1"


def test_bare_string_and_non_str_are_rejected(minilm: MiniLMEmbedder) -> None:
    with pytest.raises(EmbedError, match="wrap it in a list"):
        minilm.embed("just one text")
    with pytest.raises(EmbedError, match=r"texts\[1\]"):
        minilm.embed(["fine", 3])  # type: ignore[list-item]


def test_minilm_ranks_paraphrases(minilm: MiniLMEmbedder) -> None:
    top1, pairwise = _ranking(minilm)
    assert top1 >= 0.8, top1
    assert pairwise >= 0.97, pairwise


def test_static_ranks_paraphrases_better_than_chance(static: StaticEmbedder) -> None:
    top1, pairwise = _ranking(static)
    # Clearly weaker than MiniLM (see bench/embed_choice.py) but far from random (1/35, 0.5).
    assert top1 >= 0.35, top1
    assert pairwise >= 0.85, pairwise


def test_deterministic_and_order_independent(
    minilm: MiniLMEmbedder, static: StaticEmbedder
) -> None:
    texts = [s for s, _ in PAIRS[:12]]
    for embedder in (minilm, static):
        first = embedder.embed(texts)
        assert np.array_equal(first, embedder.embed(texts))
        # Batching and length-sorting must not change a text's vector beyond float noise.
        reversed_out = embedder.embed(texts[::-1])[::-1]
        assert np.allclose(first, reversed_out, atol=1e-5)
        one_by_one = np.vstack([embedder.embed([t]) for t in texts])
        assert np.allclose(first, one_by_one, atol=1e-5)


def test_truncation_changes_the_name() -> None:
    assert MiniLMEmbedder(max_tokens=128).name == "minilm-l6-int8@2/t128"
    assert MiniLMEmbedder(max_tokens=128, activations="float").name == "minilm-l6-int8@1/t128"
    with pytest.raises(ConfigError, match="activations: 'int4'"):
        MiniLMEmbedder(activations="int4")
    with pytest.raises(ConfigError, match="max_tokens"):
        MiniLMEmbedder(max_tokens=4)
    with pytest.raises(ConfigError, match="threads"):
        MiniLMEmbedder(threads=0)


def test_int8_activations_give_the_float_paths_vectors_within_noise(
    minilm: MiniLMEmbedder,
) -> None:
    # Two different vector spaces by name, but the same model: every held-out text's two
    # vectors are near, and each ranks the held-out pairs as well as the other.
    float_path = MiniLMEmbedder(activations="float")
    texts = [t for pair in PAIRS for t in pair] + UNRELATED
    fast, exact = minilm.embed(texts), float_path.embed(texts)
    assert not np.array_equal(fast, exact)
    cosines = (fast * exact).sum(axis=1)
    assert cosines.min() > 0.97, cosines.min()
    assert cosines.mean() > 0.985, cosines.mean()
    top1_fast, pairwise_fast = _ranking(minilm)
    top1_exact, pairwise_exact = _ranking(float_path)
    assert top1_fast >= top1_exact - 1 / len(PAIRS)
    assert pairwise_fast >= pairwise_exact - 0.01


def test_get_embedder() -> None:
    assert isinstance(get_embedder("default"), MiniLMEmbedder)
    assert isinstance(get_embedder("minilm"), MiniLMEmbedder)
    # "minilm" is the int8 path, unless the store holds only the float path's vectors.
    assert get_embedder("minilm").name == "minilm-l6-int8@2"
    assert get_embedder("default", stored={"minilm-l6-int8@1": 3}).name == "minilm-l6-int8@1"
    assert get_embedder("minilm", stored={"minilm-l6-int8@1", "minilm-l6-int8@2"}).name == (
        "minilm-l6-int8@2"
    )
    assert get_embedder("minilm", stored={"minilm-l6-static@1"}).name == "minilm-l6-int8@2"
    assert get_embedder("minilm-l6-int8@1").name == "minilm-l6-int8@1"
    assert get_embedder("minilm-l6-int8@2", stored={"minilm-l6-int8@1"}).name == (
        "minilm-l6-int8@2"
    )
    assert isinstance(get_embedder("minilm-static"), StaticEmbedder)
    remote = get_embedder("openai:nomic-embed-text", base_url="http://127.0.0.1:1/v1", dim=8)
    assert isinstance(remote, OpenAIEmbedder)
    assert remote.name == "openai:nomic-embed-text"
    with pytest.raises(ConfigError, match="base_url"):
        get_embedder("openai:x")
    with pytest.raises(ConfigError, match="unknown embedder 'word2vec'"):
        get_embedder("word2vec")


_OFFLINE_SCRIPT = """
import socket, numpy as np
from ctxwarden.embed import MiniLMEmbedder, StaticEmbedder
try:
    socket.create_connection(("pypi.org", 443), timeout=2)
except OSError:
    pass
else:
    raise SystemExit("network is reachable: the test is not offline")
for e in (MiniLMEmbedder(), StaticEmbedder()):
    v = e.embed(["offline embedding works", "second text"])
    assert v.shape == (2, e.dim) and abs(float(np.linalg.norm(v[0])) - 1) < 1e-5
print("ok")
"""


def test_embeds_with_networking_off() -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: cannot cut the network")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n needs root or user namespaces: {probe.stderr.decode().strip()}")
    result = subprocess.run(
        [unshare, "-n", sys.executable, "-c", _OFFLINE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# --- OpenAI-compatible client against a real HTTP server on 127.0.0.1 -----------------------


class _EmbeddingsHandler(BaseHTTPRequestHandler):
    """Serves /v1/embeddings with vectors from the static embedder; scripted failures first."""

    embedder: ClassVar[StaticEmbedder]
    failures: ClassVar[list[int]] = []
    requests: ClassVar[list[dict[str, Any]]] = []
    bodies: ClassVar[list[bytes]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        payload = json.loads(self.rfile.read(length))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("authorization"), "body": payload}
        )
        if self.path != "/v1/embeddings":
            self._send(404, b'{"error": "not found"}')
            return
        if type(self).failures:
            status = type(self).failures.pop(0)
            self._send(status, b'{"error": "scripted failure"}', retry_after="0")
            return
        if type(self).bodies:
            self._send(200, type(self).bodies.pop(0))
            return
        vectors = type(self).embedder.embed(payload["input"])
        data = [
            {"object": "embedding", "index": i, "embedding": (v * 3.0).tolist()}
            for i, v in enumerate(vectors)
        ]
        data.reverse()  # servers may answer out of order; the index field decides
        self._send(200, json.dumps({"object": "list", "data": data}).encode())

    def _send(self, status: int, body: bytes, retry_after: str | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        if retry_after is not None:
            self.send_header("retry-after", retry_after)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(static: StaticEmbedder) -> Iterator[str]:
    _EmbeddingsHandler.embedder = static
    _EmbeddingsHandler.failures = []
    _EmbeddingsHandler.requests = []
    _EmbeddingsHandler.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EmbeddingsHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_openai_embedder_batches_and_matches_local(server: str, static: StaticEmbedder) -> None:
    texts = [f"message number {i} about topic {i % 7}" for i in range(10)] + [""]
    remote = OpenAIEmbedder(server, "static-test", api_key="sk-test", batch_size=4, dim=256)
    # With dim given, the runtime protocol check (which reads `dim` on 3.11) sends nothing.
    assert isinstance(remote, Embedder)
    assert _EmbeddingsHandler.requests == []
    out = remote.embed(texts)
    assert out.shape == (11, 256)
    assert remote.dim == 256
    # The server scaled its vectors by 3 and sent them reversed: the client re-normalises and
    # re-orders by index.
    local = static.embed([t or " " for t in texts])
    assert np.allclose(out, local, atol=1e-5)
    requests = _EmbeddingsHandler.requests
    assert [len(r["body"]["input"]) for r in requests] == [4, 4, 3]
    assert all(
        r["auth"] == "Bearer sk-test" and r["body"]["model"] == "static-test" for r in requests
    )
    assert remote.embed([]).shape == (0, 256)
    remote.close()


def test_openai_embedder_probes_dim(server: str) -> None:
    remote = OpenAIEmbedder(server, "m")
    assert remote.dim == 256
    assert len(_EmbeddingsHandler.requests) == 1
    assert _EmbeddingsHandler.requests[0]["auth"] is None


def test_openai_embedder_retries_429_and_5xx(server: str) -> None:
    _EmbeddingsHandler.failures = [429, 503, 500]
    remote = OpenAIEmbedder(server, "m", retries=3, backoff=0.01)
    assert remote.embed(["retry me"]).shape == (1, 256)
    assert len(_EmbeddingsHandler.requests) == 4


def test_openai_embedder_gives_up_after_retries(server: str) -> None:
    _EmbeddingsHandler.failures = [502, 502, 502]
    remote = OpenAIEmbedder(server, "m", retries=2, backoff=0.01)
    with pytest.raises(UpstreamError, match=r"answered 502 \(3 attempts\)"):
        remote.embed(["x"])


def test_openai_embedder_does_not_retry_client_errors(server: str) -> None:
    _EmbeddingsHandler.failures = [400]
    remote = OpenAIEmbedder(server, "m", backoff=0.01)
    with pytest.raises(UpstreamError, match=r"answered 400.*check the model name"):
        remote.embed(["x"])
    assert len(_EmbeddingsHandler.requests) == 1
    wrong_root = OpenAIEmbedder(server.removesuffix("/v1"), "m", backoff=0.01)
    with pytest.raises(UpstreamError, match="answered 404"):
        wrong_root.embed(["x"])


def test_openai_embedder_rejects_bad_bodies(server: str) -> None:
    _EmbeddingsHandler.bodies = [
        b"<html>not json</html>",
        json.dumps({"data": [{"index": 0, "embedding": [0.1, 0.2]}]}).encode(),
        json.dumps({"data": [{"index": 0, "embedding": [float("nan"), 1.0]}]}).encode(),
    ]
    remote = OpenAIEmbedder(server, "m", backoff=0.01)
    with pytest.raises(UpstreamError, match="not an embeddings list"):
        remote.embed(["x"])
    with pytest.raises(UpstreamError, match="1 vectors for 2 texts"):
        remote.embed(["x", "y"])
    with pytest.raises(UpstreamError, match="NaN"):
        remote.embed(["x"])


def test_openai_embedder_dimension_mismatch(server: str) -> None:
    remote = OpenAIEmbedder(server, "m", dim=768)
    with pytest.raises(EmbedError, match=r"256-d vectors.*expected 768"):
        remote.embed(["x"])


def test_openai_embedder_unreachable_server() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now: every attempt is refused.
    remote = OpenAIEmbedder(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff=0.01)
    with pytest.raises(UpstreamError, match=r"could not connect.*server is running"):
        remote.embed(["x"])


def test_openai_embedder_config_errors() -> None:
    with pytest.raises(ConfigError, match="base_url"):
        OpenAIEmbedder("localhost:11434", "m")
    with pytest.raises(ConfigError, match="model"):
        OpenAIEmbedder("http://127.0.0.1:1/v1", "")
