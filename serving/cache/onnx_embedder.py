"""all-MiniLM-L6-v2 through ONNX Runtime: the local embedder's fast backend.

The model package ships torch weights only (``model.safetensors``), so the first load exports
them to ONNX: the BERT encoder with dynamic batch and sequence axes, followed by the
sentence-transformers pipeline of the folder (``modules.json``: mean pooling over the attention
mask from ``1_Pooling/config.json``, then L2 normalisation), in one graph. The file is written
atomically into a cache directory (``$XDG_CACHE_HOME/vigil/onnx`` by default) under a name that
holds the SHA-256 of the model's files, so a changed model is exported again and a file is never
half-written. Later loads need neither torch nor transformers: ``onnxruntime`` and the packaged
``tokenizer.json`` read by ``tokenizers`` (the same word pieces as sentence-transformers').

On a 2-core VM the encode of a short question takes ~5-6 ms of CPU against ~13-18 ms through
torch (docs/benchmarks.md): ONNX Runtime fuses the layer norms, the bias + GELU pairs and the
attention's scaled MatMul, and runs the graph on the calling thread without torch's
per-operator dispatch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from vigil.errors import EmbeddingError

__all__ = [
    "EXPORT_VERSION",
    "OnnxEncoder",
    "Pipeline",
    "default_onnx_dir",
    "export_onnx",
    "load_onnx_encoder",
    "model_digest",
    "onnx_file",
    "read_pipeline",
]

#: Part of every exported file's key: raise it when the exported graph changes (inputs,
#: pooling, opset), so that files written by an older version are not reused.
EXPORT_VERSION = 1
#: ONNX opset of the export; ONNX Runtime 1.17+ runs it.
OPSET = 17
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

Pooling = Literal["mean", "cls"]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What sentence-transformers does around the transformer of a model folder."""

    #: Longest input in word pieces, [CLS] and [SEP] included (``sentence_bert_config.json``).
    max_seq_length: int
    pooling: Pooling
    #: Embedding dimensions (the pooling config's ``word_embedding_dimension``).
    dimensions: int


def default_onnx_dir() -> Path:
    """Where exported models are kept: ``$XDG_CACHE_HOME/vigil/onnx``, else ``~/.cache/...``.

    Read when called (not at import), so a test or a service can point it elsewhere."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vigil" / "onnx"


def model_digest(model_path: Path) -> str:
    """SHA-256 (hex) of the export version and every file of the model folder (names and
    contents; dotfiles skipped). ~0.1 s for MiniLM's 90 MB."""
    if not model_path.is_dir():
        raise EmbeddingError("not a model folder", source=f"onnx:{model_path}")
    digest = hashlib.sha256(f"vigil-onnx-export {EXPORT_VERSION} opset {OPSET}\n".encode())
    files = sorted(p for p in model_path.rglob("*")
                   if p.is_file() and not any(part.startswith(".")
                                              for part in p.relative_to(model_path).parts))
    for file in files:
        digest.update(f"{file.relative_to(model_path).as_posix()}\0{file.stat().st_size}\0"
                      .encode())
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def onnx_file(model_path: Path, onnx_dir: Path) -> Path:
    """The exported file of ``model_path`` in ``onnx_dir`` (it may not exist yet)."""
    return onnx_dir / f"{model_path.name}-{model_digest(model_path)[:24]}.onnx"


def _read_json(path: Path, source: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EmbeddingError(f"cannot read {path.name}: {exc}", source=source) from None


def read_pipeline(model_path: Path) -> Pipeline:
    """The folder's sentence-transformers modules, if this exporter reproduces them exactly:
    Transformer, Pooling (mean or CLS), and an optional Normalize (the embedder normalises in
    any case). Anything else raises ``EmbeddingError``."""
    source = f"onnx:{model_path}"
    modules = _read_json(model_path / "modules.json", source)
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if types not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise EmbeddingError(f"unsupported sentence-transformers modules {types}",
                             source=source)
    pooling_cfg = _read_json(model_path / modules[1]["path"] / "config.json", source)
    modes = sorted(k for k, v in pooling_cfg.items() if k.startswith("pooling_mode") and v)
    known: dict[str, Pooling] = {"pooling_mode_mean_tokens": "mean",
                                 "pooling_mode_cls_token": "cls"}
    if len(modes) != 1 or modes[0] not in known:
        raise EmbeddingError(f"unsupported pooling {modes}", source=source)
    bert_cfg_path = model_path / "sentence_bert_config.json"
    max_len = (_read_json(bert_cfg_path, source).get("max_seq_length")
               if bert_cfg_path.exists() else None)
    if max_len is None:  # sentence-transformers' own default: the position table's size
        max_len = _read_json(model_path / "config.json", source)["max_position_embeddings"]
    return Pipeline(max_seq_length=int(max_len), pooling=known[modes[0]],
                    dimensions=int(pooling_cfg["word_embedding_dimension"]))


def export_onnx(model_path: Path, target: Path, pipeline: Pipeline) -> None:
    """Export the folder's transformer plus pooling and normalisation to ``target``.

    Needs torch, transformers and ``onnx`` (the legacy TorchScript exporter serialises through
    it); reads only local files. Takes ~5 s for MiniLM. The file appears atomically: it is
    written under a temporary name in the same directory, then renamed."""
    # Never reach the Hub: the model is a local folder. Read when transformers is imported.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # Eager attention traces to plain MatMul/Softmax, which ONNX Runtime fuses; tracing SDPA
    # freezes its Python-side branches (is_causal) into the graph.
    model = AutoModel.from_pretrained(str(model_path), local_files_only=True,
                                      attn_implementation="eager")
    model.eval()
    pooling = pipeline.pooling

    class Pooled(torch.nn.Module):
        """The transformer, then sentence-transformers' pooling and ``Normalize``."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            tokens = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state
            if pooling == "cls":
                pooled = tokens[:, 0]
            else:  # as sentence-transformers' Pooling: sum / clamp(count, 1e-9)
                mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * mask).sum(dim=1) / torch.clamp(mask.sum(dim=1), min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    wrapper = Pooled()
    example = torch.tensor([[101, 7592, 102]], dtype=torch.int64)  # [CLS] hello [SEP]
    axes = {name: {0: "batch", 1: "sequence"} for name in _INPUTS}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The legacy exporter's deprecation notice and tracer notes about shape checks
            # that are constant for an encoder; the agreement test checks the result.
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, (example, torch.ones_like(example),
                                        torch.zeros_like(example)), tmp,
                              input_names=list(_INPUTS), output_names=["embedding"],
                              dynamic_axes={**axes, "embedding": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users of the cache
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class OnnxEncoder:
    """One exported model in an ONNX Runtime session, with its tokenizer.

    ``threads``: ONNX Runtime intra-op threads. With 1 (the default on 2 cores) the kernels run
    on the calling thread and no thread pool exists. ``run`` is thread-safe."""

    backend = "onnx"

    def __init__(self, path: Path, tokenizer_json: Path, pipeline: Pipeline, *, threads: int):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.path = path
        self.max_seq_length = pipeline.max_seq_length
        self.threads = threads
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning workers burn a shared core between encodes (vLLM's API server and the
        # event loop want it); waking them costs microseconds.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only: no optimiser notes in the gateway's log
        self._session = ort.InferenceSession(str(path), options,
                                             providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        # tokenizer.json carries a training-time truncation (128) and fixed padding: neither
        # is sentence-transformers' behaviour, which pads to the longest and truncates at
        # max_seq_length.
        self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._batch_tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self._batch_tokenizer.enable_truncation(self.max_seq_length)
        pad = self._batch_tokenizer.token_to_id("[PAD]")
        self._batch_tokenizer.enable_padding(pad_id=pad if pad is not None else 0)

    def _run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        feed = {name: arr for name, arr in zip(_INPUTS, (ids, mask, types), strict=True)
                if name in self._inputs}
        try:
            out = self._session.run(None, feed)[0]
        except Exception as exc:  # onnxruntime's errors share no base class below Exception
            raise EmbeddingError(f"{exc.__class__.__name__}: {exc}",
                                 source=f"onnx:{self.path.name}") from exc
        return np.ascontiguousarray(out, dtype=np.float32)

    def token_count(self, text: str) -> int:
        """Word pieces of ``text``, [CLS] and [SEP] included."""
        return len(self._tokenizer.encode(text).ids)

    def encode(self, text: str) -> np.ndarray | None:
        """The unit-norm embedding (float32), or None above ``max_seq_length`` word pieces."""
        enc = self._tokenizer.encode(text)
        if len(enc.ids) > self.max_seq_length:
            return None
        ids = np.asarray([enc.ids], dtype=np.int64)
        return self._run(ids, np.asarray([enc.attention_mask], dtype=np.int64),
                         np.asarray([enc.type_ids], dtype=np.int64))[0]

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` in one run (rows, padded to the longest; truncated at
        ``max_seq_length`` as sentence-transformers does)."""
        encs = self._batch_tokenizer.encode_batch(texts)
        return self._run(np.asarray([e.ids for e in encs], dtype=np.int64),
                         np.asarray([e.attention_mask for e in encs], dtype=np.int64),
                         np.asarray([e.type_ids for e in encs], dtype=np.int64))


# One session per exported file and thread count for the process: sessions are read-only and
# thread-safe, and each holds the 90 MB of weights.
_ENCODERS: dict[tuple[str, int], OnnxEncoder] = {}
_LOCK = threading.Lock()


def load_onnx_encoder(model_path: Path, *, threads: int,
                      onnx_dir: Path | None = None) -> OnnxEncoder:
    """The ONNX Runtime encoder of a sentence-transformers folder, exporting it on first use.

    Raises ``EmbeddingError`` saying why when onnxruntime is missing, the folder's pipeline is
    not one this module reproduces, or the export or the session fails."""
    source = f"onnx:{model_path.name}"
    try:
        import onnxruntime  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise EmbeddingError(f"onnxruntime is not installed ({exc})", source=source) from None
    directory = onnx_dir if onnx_dir is not None else default_onnx_dir()
    with _LOCK:
        pipeline = read_pipeline(model_path)
        target = onnx_file(model_path, directory)
        key = (str(target), threads)
        if key in _ENCODERS:
            return _ENCODERS[key]
        exported = not target.exists()
        if exported:
            _export(model_path, target, pipeline, source)
        try:
            encoder = _open(target, model_path, pipeline, threads, source)
        except EmbeddingError:
            if exported:
                raise
            # A damaged file from an earlier run (a full disk, a bad copy): export it anew,
            # once, rather than falling back to torch on every start.
            with contextlib.suppress(OSError):  # then the export says why it cannot write
                target.unlink(missing_ok=True)
            _export(model_path, target, pipeline, source)
            encoder = _open(target, model_path, pipeline, threads, source)
        _ENCODERS[key] = encoder
        return encoder


def _export(model_path: Path, target: Path, pipeline: Pipeline, source: str) -> None:
    try:
        export_onnx(model_path, target, pipeline)
    except Exception as exc:  # any torch/transformers/onnx/OS error: reported once
        raise EmbeddingError(f"cannot export to {target}: {exc.__class__.__name__}: {exc}",
                             source=source) from exc


def _open(target: Path, model_path: Path, pipeline: Pipeline, threads: int,
          source: str) -> OnnxEncoder:
    try:
        return OnnxEncoder(target, model_path / "tokenizer.json", pipeline, threads=threads)
    except Exception as exc:  # onnxruntime's and tokenizers' errors have no common base
        raise EmbeddingError(f"cannot open {target}: {exc.__class__.__name__}: {exc}",
                             source=source) from exc
