"""The local embedder on ONNX Runtime: the export of the packaged all-MiniLM-L6-v2, agreement
with the torch pipeline, the cache directory's keys, and the fallback to torch."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from serving.cache import embedder as embedder_module
from serving.cache import onnx_embedder
from serving.cache.embedder import LocalEmbedder, embedder_from_config, local_model_path
from serving.cache.onnx_embedder import (
    OnnxEncoder,
    load_onnx_encoder,
    model_digest,
    onnx_file,
    read_pipeline,
)
from vigil.config import CacheConfig
from vigil.errors import EmbeddingError

ROOT = Path(__file__).resolve().parent.parent


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory that the module's first load exports into (seconds)."""
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def onnx_local(onnx_dir: Path) -> LocalEmbedder:
    embedder = LocalEmbedder(backend="onnx", onnx_dir=onnx_dir)
    embedder.load()
    return embedder


@pytest.fixture(scope="module")
def torch_local() -> LocalEmbedder:
    embedder = LocalEmbedder(backend="torch")
    embedder.load()
    return embedder


def varied_sentences() -> list[str]:
    """A few hundred deterministic sentences: questions, negations, numbers, commands, short
    and long, non-ASCII."""
    subjects = ["my password", "the invoice", "two-factor authentication", "the API key",
                "a team member", "the webhook", "the dark theme", "the audit log"]
    frames = ["How do I reset {}?", "Why can't I change {}?", "I did not update {}.",
              "Never share {} with anyone", "Is {} not working again?",
              "Please delete {} before 5 pm.", "Can {} be restored after 30 days?",
              "{}"]
    out = [f.format(s) for s in subjects for f in frames]
    out += [f"What is {a}% of {b}?" for a in (3, 15, 99) for b in (7, 200, 1_000_000)]
    out += [f"Order #{n} shipped on 2026-0{n % 9 + 1}-1{n % 10} for ${n * 3.5:.2f}"
            for n in range(1, 25)]
    out += ["turn on the light", "turn off the light", "don't stop", "ok", "?", "", "a",
            "No.", "yes", "42", "3 < 5", "5 < 3", "log in", "log out"]
    out += ["Où est la gare ? Je ne la trouve pas.", "Über die Brücke, nicht darunter.",
            "naïve café résumé", "Как сбросить пароль?", "パスワードをリセットするには？",
            "如何重置我的密码？", "كيف أعيد تعيين كلمة المرور؟", "비밀번호를 잊었어요",
            "emoji 🙂 and 🚀 and ✔", "Zürich – Genève — 10 €", "ﬁnancial ﬂow (ligatures)",
            "Ελληνικά γράμματα αβγ", "tab\tand\nnewline", "  leading and trailing  "]
    clause = "the replica restarted after the queue filled up and the cache was cold"
    out += [", and ".join([clause] * n) for n in (2, 5, 10, 15)]  # ~30-210 word pieces
    out += [" ".join(f"word{i}" for i in range(n)) for n in (10, 40, 80)]
    out += [f"Q{i}: is feature {chr(65 + i % 26)} enabled for tenant {i * 7}?"
            for i in range(60)]
    rng = random.Random(7)
    who = ["The admin", "A new user", "Nobody", "Our team", "The scheduler", "She"]
    verbs = ["can't open", "always closes", "never renames", "quickly exports", "did restore",
             "should not delete"]
    what = ["the quarterly report", "3 dashboards", "the SSO settings", "every alert rule",
            "the 1.5 GB backup", "an old invoice from 2019"]
    when = ["", " today", " before lunch", " after the upgrade", " unless asked twice",
            " on Fridays?"]
    out += sorted({f"{rng.choice(who)} {rng.choice(verbs)} {rng.choice(what)}"
                   f"{rng.choice(when)}" for _ in range(150)})
    return out


def test_the_sentences_are_varied_and_many() -> None:
    sentences = varied_sentences()
    assert len(sentences) >= 250 and len(set(sentences)) == len(sentences)
    assert any(not s.isascii() for s in sentences)


def test_onnx_vectors_agree_with_torch(onnx_local: LocalEmbedder,
                                       torch_local: LocalEmbedder) -> None:
    assert (onnx_local.backend, torch_local.backend) == ("onnx", "torch")

    async def go() -> list[tuple[str, float]]:
        worst = []
        for text in varied_sentences():
            a, b = await onnx_local.embed(text), await torch_local.embed(text)
            assert a is not None and b is not None, text
            assert a.dtype == np.float32 and a.shape == (384,)
            assert abs(float(np.linalg.norm(a)) - 1.0) < 1e-5
            worst.append((text, float(np.dot(a, b))))
        return worst
    cosines = run(go())
    bad = [(t, c) for t, c in cosines if not c > 0.999]
    assert not bad, bad


def test_the_word_pieces_match_sentence_transformers(onnx_local: LocalEmbedder,
                                                     torch_local: LocalEmbedder) -> None:
    onnx_enc, torch_enc = onnx_local._model, torch_local._model
    st_tokenizer = torch_enc._model.tokenizer
    for text in varied_sentences():
        ids = st_tokenizer(text, add_special_tokens=True)["input_ids"]
        assert onnx_enc.token_count(text) == len(ids), text
    assert onnx_enc.max_seq_length == torch_enc.max_seq_length == 256


def test_texts_beyond_the_window_are_not_embedded_by_either(
        onnx_local: LocalEmbedder, torch_local: LocalEmbedder) -> None:
    long_text = "Please review this log line carefully. " * 60  # > 256 word pieces

    async def go() -> None:
        assert await onnx_local.embed(long_text) is None
        assert await torch_local.embed(long_text) is None
    run(go())


def test_a_padded_batch_equals_single_encodes(onnx_local: LocalEmbedder) -> None:
    encoder: OnnxEncoder = onnx_local._model
    texts = ["ok", "How do I reset my password?", "Über die Brücke, nicht darunter.",
             ", and ".join(["the replica restarted after the queue filled up"] * 8)]
    batch = encoder.encode_batch(texts)
    assert batch.shape == (len(texts), 384)
    for text, row in zip(texts, batch, strict=True):
        single = encoder.encode(text)
        assert single is not None and float(np.dot(single, row)) > 0.99999, text


def test_the_export_is_written_once_atomically_and_reused(
        onnx_local: LocalEmbedder, onnx_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = sorted(p.name for p in onnx_dir.iterdir())
    assert files == [onnx_file(local_model_path(), onnx_dir).name]  # no temporary left
    assert (onnx_dir / files[0]).stat().st_mode & 0o777 == 0o644

    def no_export(*_: Any) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_embedder, "export_onnx", no_export)
    monkeypatch.setattr(onnx_embedder, "_ENCODERS", {})  # a new process, as far as it knows
    again = LocalEmbedder(backend="onnx", onnx_dir=onnx_dir)
    again.load()
    assert again.backend == "onnx" and again._model is not onnx_local._model
    vec = run(again.embed("How do I reset my password?"))
    ref = run(onnx_local.embed("How do I reset my password?"))
    assert vec is not None and ref is not None and float(np.dot(vec, ref)) > 0.99999
    run(again.aclose())


def test_the_export_is_keyed_by_the_model_files(tmp_path: Path) -> None:
    model = local_model_path()
    copy = tmp_path / model.name
    for file in model.rglob("*"):
        if file.is_file():
            (copy / file.relative_to(model)).parent.mkdir(parents=True, exist_ok=True)
            (copy / file.relative_to(model)).symlink_to(file)
    assert model_digest(copy) == model_digest(model)
    assert onnx_file(copy, tmp_path) == onnx_file(model, tmp_path)
    changed = copy / "sentence_bert_config.json"
    changed.unlink()
    changed.write_text('{"max_seq_length": 128, "do_lower_case": false}')
    assert onnx_file(copy, tmp_path) != onnx_file(model, tmp_path)
    assert read_pipeline(copy).max_seq_length == 128


def _write_folder(path: Path, *, pooling: dict[str, bool], modules: list[str]) -> Path:
    path.mkdir()
    (path / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": "1_Pooling" if t == "Pooling" else "",
         "type": f"sentence_transformers.models.{t}"} for i, t in enumerate(modules)]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 8, **pooling}))
    (path / "config.json").write_text('{"max_position_embeddings": 64}')
    return path


def test_the_pipeline_is_read_from_the_folder(tmp_path: Path) -> None:
    packaged = read_pipeline(local_model_path())
    assert (packaged.pooling, packaged.max_seq_length, packaged.dimensions) == ("mean", 256, 384)
    cls = read_pipeline(_write_folder(tmp_path / "cls", modules=["Transformer", "Pooling"],
                                      pooling={"pooling_mode_cls_token": True,
                                               "pooling_mode_mean_tokens": False}))
    assert (cls.pooling, cls.max_seq_length) == ("cls", 64)  # no sentence_bert_config.json


@pytest.mark.parametrize(("modules", "pooling", "message"), [
    (["Transformer", "Pooling"], {"pooling_mode_max_tokens": True}, "unsupported pooling"),
    (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True,
                                  "pooling_mode_cls_token": True}, "unsupported pooling"),
    (["Transformer", "Pooling", "Dense", "Normalize"], {"pooling_mode_mean_tokens": True},
     "unsupported sentence-transformers modules"),
])
def test_pipelines_the_export_cannot_reproduce_are_refused(
        tmp_path: Path, modules: list[str], pooling: dict[str, bool], message: str) -> None:
    folder = _write_folder(tmp_path / "m", modules=modules, pooling=pooling)
    with pytest.raises(EmbeddingError, match=message):
        read_pipeline(folder)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedder_module, "_FALLBACK_WARNED", set())


def _fallback_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "ONNX Runtime not used" in r.getMessage()]


@pytest.mark.usefixtures("fresh_warnings")
def test_without_onnxruntime_auto_falls_back_to_torch_and_warns_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails
    caplog.set_level(logging.WARNING, logger="vigil.cache")
    first, second = (LocalEmbedder(onnx_dir=tmp_path) for _ in range(2))
    first.load()
    second.load()
    assert (first.backend, second.backend) == ("torch", "torch")
    warned = _fallback_warnings(caplog)
    assert len(warned) == 1 and "onnxruntime is not installed" in warned[0]
    assert run(first.embed("How do I reset my password?")) is not None
    assert list(tmp_path.iterdir()) == []  # nothing exported

    forced = LocalEmbedder(backend="onnx", onnx_dir=tmp_path)
    with pytest.raises(EmbeddingError, match="cannot load the model with ONNX Runtime"):
        run(forced.warm_up())
    for embedder in (first, second, forced):
        run(embedder.aclose())


@pytest.mark.usefixtures("fresh_warnings")
def test_a_failing_export_falls_back_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("the exporter broke")

    monkeypatch.setattr(onnx_embedder, "export_onnx", broken)
    caplog.set_level(logging.WARNING, logger="vigil.cache")
    embedder = LocalEmbedder(onnx_dir=tmp_path / "cache")
    embedder.load()
    assert embedder.backend == "torch"
    warned = _fallback_warnings(caplog)
    assert len(warned) == 1 and "cannot export" in warned[0] and "exporter broke" in warned[0]
    with pytest.raises(EmbeddingError, match="exporter broke"):
        load_onnx_encoder(local_model_path(), threads=1, onnx_dir=tmp_path / "cache")
    run(embedder.aclose())


def test_forced_torch_never_touches_onnx(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def no_onnx(*_: Any, **__: Any) -> None:
        raise AssertionError("ONNX Runtime was tried")

    monkeypatch.setattr(embedder_module, "load_onnx_encoder", no_onnx)
    embedder = LocalEmbedder(backend="torch", onnx_dir=tmp_path)
    embedder.load()
    assert embedder.backend == "torch"
    run(embedder.aclose())


def test_the_backend_switch_in_the_config() -> None:
    assert CacheConfig().embedding_backend == "auto"
    for backend in ("auto", "onnx", "torch"):
        embedder = embedder_from_config(CacheConfig(enabled=True, embedding_backend=backend))
        assert isinstance(embedder, LocalEmbedder)
        assert embedder.requested_backend == backend and embedder.backend is None
        run(embedder.aclose())
    with pytest.raises(ValidationError, match="embedding_backend"):
        CacheConfig(embedding_backend="tensorflow")
    with pytest.raises(ValueError, match="backend"):
        LocalEmbedder(backend="tensorflow")  # type: ignore[arg-type]


def test_an_exported_model_loads_without_torch(onnx_local: LocalEmbedder,
                                               onnx_dir: Path) -> None:
    # A fresh process: the gateway's later starts import neither torch nor transformers.
    script = textwrap.dedent(f"""
        import asyncio, sys
        from serving.cache import LocalEmbedder
        e = LocalEmbedder(backend="onnx", onnx_dir={str(onnx_dir)!r})
        e.load()
        vec = asyncio.run(e.embed("How do I reset my password?"))
        assert vec is not None and vec.shape == (384,)
        heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers")
                       if m in sys.modules)
        print(e.backend, heavy)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "onnx []", out.stderr


def test_the_sessions_threads_follow_the_embedder(onnx_dir: Path) -> None:
    embedder = LocalEmbedder(backend="onnx", onnx_dir=onnx_dir, threads=2)
    embedder.load()
    options = embedder._model._session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert embedder._model.threads == 2
    run(embedder.aclose())


def test_a_damaged_export_is_exported_again(onnx_local: LocalEmbedder, onnx_dir: Path,
                                            tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    good = onnx_file(local_model_path(), onnx_dir)
    damaged = onnx_file(local_model_path(), tmp_path)
    damaged.write_bytes(good.read_bytes()[: 1 << 20])  # cut short
    exports: list[Path] = []

    def copy_export(_: Path, target: Path, __: Any) -> None:  # the real one takes seconds
        exports.append(target)
        target.write_bytes(good.read_bytes())

    monkeypatch.setattr(onnx_embedder, "export_onnx", copy_export)
    encoder = load_onnx_encoder(local_model_path(), threads=1, onnx_dir=tmp_path)
    assert exports == [damaged]
    vec = encoder.encode("How do I reset my password?")
    assert vec is not None and vec.shape == (384,)
