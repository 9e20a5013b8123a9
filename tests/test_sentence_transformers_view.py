"""The sentence-transformers view of a published IFCL folder (``ifcl.publishing``): true to a sentence-transformers
base encoder, written as sentence-transformers 6 writes models, loading cleanly and embedding like
``IFCLModel.encode``."""

from __future__ import annotations

import json
import logging
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ENGLISH, GERMAN

from ifcl.model import IFCLModel
from ifcl.pooling import BaseFolder, read_base
from ifcl.publishing import adopt_base, save_published
from modeling_ifcl import max_input_length

sentence_transformers = pytest.importorskip("sentence_transformers")

# Longer than the base's max_seq_length of 20 tokens: truncation must agree too.
LONG = " ".join(ENGLISH[:4])
SENTENCES = [*ENGLISH, LONG, *GERMAN[:3]]


@pytest.fixture(scope="module")
def st_base_dir(tiny_encoder_dir, tmp_path_factory) -> Path:
    """A sentence-transformers model around the tiny encoder: max_seq_length 20, mean pooling, Normalize, a query
    prompt and dot-product similarity, saved by sentence-transformers itself."""
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(str(tiny_encoder_dir))
    transformer.max_seq_length = 20
    model = sentence_transformers.SentenceTransformer(
        modules=[transformer, Pooling(32, "mean"), Normalize()],
        prompts={"query": "query: "},
        similarity_fn_name="dot",
        device="cpu",
    )
    folder = tmp_path_factory.mktemp("st_base")
    model.save(str(folder))
    return folder


@contextmanager
def load_messages():
    """Every warning and every log record of WARNING or above that transformers and sentence-transformers emit
    inside the block (transformers logs its load report, MISSING / newly initialized weights, as a warning)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(f"{record.name}: {record.getMessage()}")

    handler = Collect(level=logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("transformers", "sentence_transformers")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield records
        records += [f"{w.category.__name__}: {w.message}" for w in caught]
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def load_view(folder: Path):
    """``SentenceTransformer(folder)``, and what it reported while loading."""
    with load_messages() as messages:
        model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    return model, messages


def module_types(folder: Path) -> list[str]:
    return [module["type"] for module in json.loads((folder / "modules.json").read_text())]


def view_files(folder: Path) -> dict[str, object]:
    """The folder's JSON files, without the library versions and the fast tokenizers' state of their last call
    (which transformers saves, and sets anew at every call)."""
    files = {}
    for path in sorted(folder.rglob("*.json")):
        content = json.loads(path.read_text())
        if path.name == "config_sentence_transformers.json":
            content.pop("__version__")
        if path.name == "tokenizer.json":
            content.pop("truncation"), content.pop("padding")
        files[str(path.relative_to(folder))] = content
    return files


@pytest.mark.parametrize("pooler", ["avg", "cls"])
def test_view_of_a_sentence_transformers_base_is_true_to_it_and_embeds_like_encode(st_base_dir, tmp_path, pooler):
    model = IFCLModel.from_encoder(str(st_base_dir), queue_size=0, pooler_type=pooler, eval_pooler_type=pooler)
    if model.mlp is not None:
        torch.nn.init.normal_(model.mlp.dense.weight)  # make the MLP matter
    save_published(model, tmp_path / "saved")
    base = sentence_transformers.SentenceTransformer(str(st_base_dir), device="cpu")
    view, messages = load_view(tmp_path / "saved")

    # No MISSING / newly initialized weights, no deprecated module names. With cls, SimCSE's MLP is stored twice, in
    # the root (IFCLModel's) and as the Dense module's weights: the root copy is reported as not the encoder's.
    expected = ["mlp.dense.weight", "mlp.dense.bias"] if pooler == "cls" else []
    assert all(any(key in message for key in expected) for message in messages), messages
    assert view.max_seq_length == base.max_seq_length == 20
    assert view.prompts == base.prompts and view.prompts["query"] == "query: "
    assert view.similarity_fn_name == "dot"
    assert view.default_prompt_name is None
    kinds = [type(module).__name__ for module in view]
    assert kinds == ["Transformer", "Pooling", *(["Dense"] if pooler == "cls" else []), "Normalize"]

    ours = model.encode(SENTENCES, normalize_embeddings=True)
    theirs = view.encode(SENTENCES, batch_size=5, convert_to_tensor=True)
    assert (ours - theirs).abs().max().item() <= 1e-5
    ours = model.encode(SENTENCES, prompt="query: ", normalize_embeddings=True)
    theirs = view.encode(SENTENCES, prompt_name="query", convert_to_tensor=True)
    assert (ours - theirs).abs().max().item() <= 1e-5
    if pooler == "avg":  # untrained: the IFCL model still embeds like its base
        assert (ours - base.encode(SENTENCES, prompt_name="query", convert_to_tensor=True)).abs().max() <= 1e-5


def test_view_is_written_as_sentence_transformers_6_writes_models(st_base_dir, tmp_path):
    model = IFCLModel.from_encoder(str(st_base_dir), queue_size=0, pooler_type="cls", eval_pooler_type="cls")
    save_published(model, tmp_path / "saved")
    sentence_transformers.SentenceTransformer(str(st_base_dir), device="cpu").save(str(tmp_path / "resaved_base"))
    ours, theirs = tmp_path / "saved", tmp_path / "resaved_base"

    # The module class names sentence-transformers writes today (no deprecated sentence_transformers.models.*).
    assert set(module_types(ours)) - set(module_types(theirs)) == {"sentence_transformers.base.modules.dense.Dense"}
    assert not any(kind.startswith("sentence_transformers.models.") for kind in module_types(ours))
    for name in ("config_sentence_transformers.json",):
        ours_config, theirs_config = json.loads((ours / name).read_text()), json.loads((theirs / name).read_text())
        assert ours_config == theirs_config
    assert json.loads((ours / "1_Pooling" / "config.json").read_text()) == {
        "embedding_dimension": 32,
        "pooling_mode": "cls",
        "include_prompt": True,
    }
    assert (ours / "3_Normalize" / "config.json").read_text() == (theirs / "2_Normalize" / "config.json").read_text()
    # The Transformer module is the folder itself, as in sentence-transformers' own published models.
    assert json.loads((ours / "modules.json").read_text())[0]["path"] == ""
    ours_transformer = json.loads((ours / "sentence_bert_config.json").read_text())
    theirs_transformer = json.loads((theirs / "sentence_bert_config.json").read_text())
    assert ours_transformer.pop("model_kwargs") == {"add_pooling_layer": False}  # saved without BERT's pooler head
    assert ours_transformer == theirs_transformer
    # The truncation length lives in the tokenizer, as sentence-transformers 6 keeps it.
    tokenizer_config = json.loads((ours / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == 20


def test_view_of_a_plain_encoder_loads_cleanly_without_normalize(tiny_encoder_dir, tmp_path):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    save_published(model, tmp_path / "saved")
    assert model.sentence_transformers_base is None
    view, messages = load_view(tmp_path / "saved")
    assert not messages, messages
    assert [type(module).__name__ for module in view] == ["Transformer", "Pooling"]
    assert view.max_seq_length == max_input_length(model.tokenizer, model.encoder.config) == 128  # its positions
    assert view.similarity_fn_name == "cosine"
    assert (model.encode(SENTENCES) - view.encode(SENTENCES, convert_to_tensor=True)).abs().max() <= 1e-5


def test_a_plain_encoders_base_is_read_once_and_the_view_leaves_no_temporary_file(
    tiny_encoder_dir, tmp_path, monkeypatch
):
    """The run's preparation reads the base (``adopt_base``; None: a plain encoder); the view does not look it up
    again. Its JSON files are written whole (through a temporary file renamed over each), and none is left behind."""
    from ifcl import publishing

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    assert adopt_base(model) is None and model.sentence_transformers_base is None
    monkeypatch.setattr(BaseFolder, "read", lambda path: pytest.fail(f"{path}'s base read again"))
    save_published(model, tmp_path / "saved")
    assert module_types(tmp_path / "saved") == [publishing.ST_TRANSFORMER, publishing.ST_POOLING]
    assert not [path.name for path in (tmp_path / "saved").rglob("*.tmp-*")]


def test_the_view_of_a_model_that_never_adopted_its_base_reads_it(st_base_dir, tmp_path):
    from ifcl.publishing import ST_NORMALIZE, save_view

    model = IFCLModel.from_encoder(str(st_base_dir), queue_size=0)  # a model adopt_base never saw
    model.save_pretrained(tmp_path / "saved")
    assert save_view(model, tmp_path / "saved")
    assert module_types(tmp_path / "saved")[-1] == ST_NORMALIZE


def test_a_loaded_model_writes_the_same_view_and_embeds_the_same(st_base_dir, tmp_path):
    model = IFCLModel.from_encoder(str(st_base_dir), queue_size=0)
    save_published(model, tmp_path / "first")
    assert model.sentence_transformers_base == read_base(str(st_base_dir))
    loaded = IFCLModel.from_pretrained(tmp_path / "first")
    # The published folder is itself a sentence-transformers model: the same facts are read back from it.
    assert adopt_base(loaded) == model.sentence_transformers_base
    assert loaded.sentence_transformers_base["max_seq_length"] == 20
    assert loaded.sentence_transformers_base["normalize"]
    save_published(loaded, tmp_path / "second")  # the tokenizer was never used: it is saved all the same
    assert view_files(tmp_path / "second") == view_files(tmp_path / "first")
    expected = model.encode(SENTENCES, prompt="query: ")
    again = IFCLModel.from_pretrained(tmp_path / "second").encode(SENTENCES, prompt="query: ")
    torch.testing.assert_close(again, expected, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_through_remote_code_a_published_model_embeds_as_in_training(st_base_dir, tiny_fraternal_dir, tmp_path):
    """What a Hub user does: AutoModel with remote code in a fresh interpreter (the project not importable), then
    encode, with a prompt too: the embeddings of the trained model, truncated at its base's 20 tokens; the fraternal
    model's tokenizer loads from the folder and reads as in training."""
    import os
    import subprocess
    import sys
    import textwrap

    model = IFCLModel.from_encoder(
        str(st_base_dir), str(tiny_fraternal_dir), fusion_rate=0.3, queue_size=2, queue_batch_size=4
    )
    folder = tmp_path / "first"
    save_published(model, folder)
    assert (folder / "modeling_ifcl.py").is_file() and (folder / "configuration_ifcl.py").is_file()
    assert (folder / "fraternal_tokenizer" / "tokenizer_config.json").is_file()
    assert max_input_length(model.tokenizer, model.encoder.config) == 20
    assert len(model.tokenizer(LONG)["input_ids"]) > 20  # LONG is truncated
    torch.save(model.encode(SENTENCES), tmp_path / "expected.pt")
    torch.save(model.encode(SENTENCES, prompt="query: ", normalize_embeddings=True), tmp_path / "prompted.pt")
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        from transformers import AutoModel, AutoTokenizer
        model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        embeddings = model.encode({SENTENCES!r})
        prompted = model.encode({SENTENCES!r}, prompt="query: ", normalize_embeddings=True)
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        expected_prompted = torch.load({str(tmp_path / "prompted.pt")!r})
        german = AutoTokenizer.from_pretrained({str(folder)!r}, subfolder="fraternal_tokenizer")({GERMAN[:1]!r})
        print(json.dumps({{
            "class": type(model).__name__,
            "module": type(model).__module__,
            "max_abs_diff": (embeddings - expected).abs().max().item(),
            "diff": (prompted - expected_prompted).abs().max().item(),
            "max_length": sys.modules[type(model).__module__].max_input_length(model.tokenizer, model.encoder.config),
            "base_model_is_encoder": model.base_model is model.encoder,
            "fusion_rate": model.config.fusion_rate,
            "german_ids": german["input_ids"],
        }}))
        """
    )
    # A fresh interpreter that cannot import the project's files: only the saved folder's remote code.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["class"] == "IFCLModel"
    assert report["module"].startswith("transformers_modules") and report["diff"] <= 1e-5
    assert report["max_abs_diff"] <= 1e-5
    assert report["max_length"] == 20  # the base's truncation, read back by the remote code
    assert report["base_model_is_encoder"]
    assert report["fusion_rate"] == 0.3
    assert report["german_ids"] == model.fraternal_tokenizer(GERMAN[:1])["input_ids"]


def test_the_encoder_is_stored_once_under_its_own_names(st_base_dir, tmp_path):
    """Decision: one weights file. The encoder's weights carry the names its plain AutoModel reads (its own
    base_model_prefix), so sentence-transformers' Transformer module and AutoModel read them from the root folder;
    a frozen fraternal table that copies the encoder's is not stored at all."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    model = IFCLModel.from_encoder(str(st_base_dir), queue_size=0)
    assert model.config.shares_word_table and model.fraternal_embeddings is None
    save_published(model, tmp_path / "saved")
    weight_files = sorted(
        str(path.relative_to(tmp_path / "saved")) for path in (tmp_path / "saved").rglob("*.safetensors")
    )
    assert weight_files == ["model.safetensors"]
    stored = load_file(str(tmp_path / "saved" / "model.safetensors"))
    own = {f"{model.encoder_prefix}.{name}": tensor for name, tensor in model.encoder.state_dict().items()}
    assert model.encoder_prefix == "bert" and stored.keys() == own.keys()
    assert all(torch.equal(stored[name], own[name]) for name in own)
    with load_messages() as messages:
        plain = AutoModel.from_pretrained(tmp_path / "saved", add_pooling_layer=False)
    assert type(plain).__name__ == "BertModel" and not messages, messages
    assert all(torch.equal(tensor, own[f"bert.{name}"]) for name, tensor in plain.state_dict().items())


def test_encode_converts_and_normalizes_like_sentence_transformers(tiny_encoder_dir):
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    default = model.encode(ENGLISH[:4])
    assert isinstance(default, torch.Tensor) and default.dtype == torch.float32 and default.shape == (4, 32)
    array = model.encode(ENGLISH[:4], convert_to_numpy=True)
    assert isinstance(array, np.ndarray) and array.dtype == np.float32
    np.testing.assert_allclose(array, default.numpy(), atol=1e-6)
    assert isinstance(model.encode(ENGLISH[:4], convert_to_numpy=True, convert_to_tensor=True), torch.Tensor)
    rows = model.encode(ENGLISH[:4], convert_to_numpy=False, convert_to_tensor=False)
    assert isinstance(rows, list) and len(rows) == 4 and torch.allclose(torch.stack(rows), default)
    unit = model.encode(ENGLISH[:4], normalize_embeddings=True)
    assert torch.allclose(unit.norm(dim=1), torch.ones(4), atol=1e-6)
    assert torch.allclose(unit, torch.nn.functional.normalize(default, dim=1), atol=1e-6)
    prompted = model.encode(ENGLISH[:2], prompt="query: ")
    assert torch.allclose(prompted, model.encode([f"query: {s}" for s in ENGLISH[:2]]))
    assert not torch.allclose(prompted, default[:2])


def test_with_trust_remote_code_sentence_transformers_runs_the_ifcl_model_alike(tiny_encoder_dir, tmp_path):
    """Users of the Hub's remote-code embedding models pass trust_remote_code=True: the Transformer module then runs
    IFCLModel itself (its forward gives last_hidden_state), with the same embeddings as without."""
    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    save_published(model, tmp_path / "saved")
    plain = sentence_transformers.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    remote = sentence_transformers.SentenceTransformer(str(tmp_path / "saved"), device="cpu", trust_remote_code=True)
    assert type(remote[0].model).__name__ == "IFCLModel" and type(plain[0].model).__name__ == "BertModel"
    ours = model.encode(SENTENCES)
    for view in (plain, remote):
        theirs = view.encode(SENTENCES, convert_to_tensor=True)
        assert (
            torch.nn.functional.normalize(ours, dim=1) - torch.nn.functional.normalize(theirs, dim=1)
        ).abs().max() <= 1e-5


def sentence_transformer_base(encoder: Path, pooling_mode: str, folder: Path) -> Path:
    """``encoder`` saved by sentence-transformers with a Pooling module of ``pooling_mode`` and Normalize, as BGE
    (CLS) or Qwen3-Embedding (last token) ship."""
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(str(encoder), max_seq_length=16)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode)
    model = sentence_transformers.SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu")
    model.save(str(folder))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("pooling_mode, pooler", [("cls", "cls_before_pooler"), ("lasttoken", "last")])
def test_a_base_trained_without_pooler_flags_publishes_a_model_that_pools_as_it_did(
    pooling_mode, pooler, tiny_encoder_dir, pairs_data, tmp_path, caplog
):
    """BGE pools with CLS, Qwen3-Embedding with the last token: run_ifcl.py with no pooler flag takes the base's
    Pooling module for both poolers and says so, and the published folder pools as the base did (its Pooling
    module, its card)."""
    from conftest import build_tiny_decoder, objective_run_args

    import run_ifcl

    encoder = tiny_encoder_dir if pooling_mode == "cls" else build_tiny_decoder("qwen3", tmp_path / "qwen3")
    base = sentence_transformer_base(encoder, pooling_mode, tmp_path / "base")
    output = tmp_path / "run"
    caplog.set_level(logging.INFO)
    run_ifcl.main(objective_run_args(base, pairs_data, output, "ifcl", "--max_seq_length", "16"))
    assert f"pooler_type {pooler}, eval_pooler_type {pooler}: as its base pools (its Pooling module, " in caplog.text
    config = json.loads((output / "config.json").read_text())["ifcl"]
    assert (config["pooler_type"], config["eval_pooler_type"]) == (pooler, pooler)
    assert json.loads((output / "1_Pooling" / "config.json").read_text())["pooling_mode"] == pooling_mode
    assert "as its base pools (the base's Pooling module)" in (output / "README.md").read_text()
    published = sentence_transformers.SentenceTransformer(str(output), device="cpu")
    trained = IFCLModel.from_pretrained(str(output)).encode(ENGLISH, normalize_embeddings=True)
    torch.testing.assert_close(published.encode(ENGLISH, convert_to_tensor=True), trained, atol=1e-5, rtol=0)


def test_the_base_pooling_is_the_default_and_a_pooler_set_otherwise_is_warned_about(
    tiny_encoder_dir, tmp_path, caplog
):
    from ifcl.pooling import BaseFolder, choose_poolers

    base = sentence_transformer_base(tiny_encoder_dir, "cls", tmp_path / "cls")
    model = IFCLModel.from_encoder(str(base), queue_size=0)
    assert (model.config.pooler_type, model.config.eval_pooler_type) == ("cls_before_pooler", "cls_before_pooler")
    poolers, notes = choose_poolers(
        BaseFolder.read(str(base)), {"pooler_type": "cls"}
    )  # SimCSE's MLP over [CLS]: CLS all the same
    assert poolers == {"pooler_type": "cls", "eval_pooler_type": "cls_before_pooler"}
    assert [level for level, _ in notes] == [logging.INFO]
    with caplog.at_level(logging.WARNING):
        model = IFCLModel.from_encoder(str(base), queue_size=0, eval_pooler_type="avg")
    assert model.config.eval_pooler_type == "avg"
    assert f"eval_pooler_type avg is set, but {base} pools with cls_before_pooler (its Pooling module" in caplog.text
    assert choose_poolers(BaseFolder.read(str(tiny_encoder_dir)), {})[0] == {
        "pooler_type": "avg",
        "eval_pooler_type": "avg",
    }


def test_a_base_that_leaves_its_default_prompt_out_of_the_pooling_embeds_as_it_does_in_every_view(
    tiny_encoder_dir, tmp_path
):
    """An instruction-tuned embedder's shape: mean pooling with ``include_prompt=False`` and a default prompt.
    ``from_encoder(...).encode`` puts the default prompt before each sentence and pools without its tokens, as the
    base does, with a prompt given too; the published folder keeps both, and its sentence-transformers view,
    ``IFCLModel.from_pretrained`` and ``encode`` embed alike (1e-5)."""
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(str(tiny_encoder_dir), max_seq_length=32)
    base_model = sentence_transformers.SentenceTransformer(
        modules=[transformer, Pooling(32, "mean", include_prompt=False)],
        prompts={"query": "query: ", "document": "passage: "},
        default_prompt_name="query",
        device="cpu",
    )
    base_model.save(str(tmp_path / "base"))
    model = IFCLModel.from_encoder(str(tmp_path / "base"), queue_size=0)
    assert (model.config.include_prompt, model.config.default_prompt) == (False, "query: ")
    expected = base_model.encode(ENGLISH, convert_to_tensor=True)
    torch.testing.assert_close(model.encode(ENGLISH), expected, atol=1e-5, rtol=0)
    with_prompt = base_model.encode(ENGLISH, prompt="passage: ", convert_to_tensor=True)
    torch.testing.assert_close(model.encode(ENGLISH, prompt="passage: "), with_prompt, atol=1e-5, rtol=0)
    assert not torch.allclose(model.encode(ENGLISH, prompt=""), expected, atol=1e-3)  # the prompt is read
    model.config.include_prompt = True
    assert not torch.allclose(model.encode(ENGLISH), expected, atol=1e-3)  # and left out of the pooling
    model.config.include_prompt = False

    save_published(model, tmp_path / "published")
    pooling = json.loads((tmp_path / "published" / "1_Pooling" / "config.json").read_text())
    assert pooling["include_prompt"] is False
    view = sentence_transformers.SentenceTransformer(str(tmp_path / "published"), device="cpu")
    torch.testing.assert_close(view.encode(ENGLISH, convert_to_tensor=True), expected, atol=1e-5, rtol=0)
    loaded = IFCLModel.from_pretrained(tmp_path / "published")
    torch.testing.assert_close(loaded.encode(ENGLISH), expected, atol=1e-5, rtol=0)


def test_a_base_pooling_mode_without_a_pooler_here_is_refused_unless_both_are_set_then_warned_and_carded(
    tiny_encoder_dir, tmp_path
):
    from ifcl.model_card import pooling_description
    from ifcl.pooling import BaseFolder, choose_poolers

    base = sentence_transformer_base(tiny_encoder_dir, "max", tmp_path / "max")
    with pytest.raises(ValueError, match=r"its Pooling module \(1_Pooling/config.json\) pools with max, which"):
        IFCLModel.from_encoder(str(base), queue_size=0, pooler_type="avg")
    both = {"pooler_type": "avg", "eval_pooler_type": "avg"}
    poolers, notes = choose_poolers(BaseFolder.read(str(base)), both)
    assert poolers == both  # accepted, and said for each: the model pools otherwise than its base
    warned = [note for level, note in notes if level == logging.WARNING]
    assert warned == [
        f"{name} avg is set, but {base} pools with max (its Pooling module, 1_Pooling/config.json): the model will "
        "embed otherwise than its base."
        for name in ("pooler_type", "eval_pooler_type")
    ]
    model = IFCLModel.from_encoder(str(base), queue_size=0, **both)
    card_pooling = pooling_description(model.config, BaseFolder.read(str(base)))
    assert "its base pools otherwise (`max`, its Pooling module), and this run chose `avg`" in card_pooling
    # sentence-transformers before 6 wrote one flag per mode
    (base / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    assert choose_poolers(BaseFolder.read(str(base)), {})[0] == {
        "pooler_type": "cls_before_pooler",
        "eval_pooler_type": "cls_before_pooler",
    }


def test_the_published_tokenizer_truncates_at_the_models_limit_whatever_the_last_call_asked(
    tiny_encoder_dir, tmp_path
):
    """Training tokenizes at --max_seq_length and the fast tokenizer keeps the last call's truncation: a folder saved
    after it would say the training length; it is saved without the call's truncation and padding, its limit the
    model's (``model_max_length``), the same whatever the run did last."""
    from transformers import AutoTokenizer

    model = IFCLModel.from_encoder(str(tiny_encoder_dir), queue_size=0)
    model.tokenizer(ENGLISH, truncation=True, max_length=5, padding="max_length")
    save_published(model, tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None
    loaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert loaded.model_max_length == max_input_length(model.tokenizer, model.encoder.config) == 128


def test_a_base_whose_pooling_settings_are_missing_is_named_not_taken_as_mean(tiny_encoder_dir, tmp_path):
    """A Pooling module named by modules.json whose config.json is gone: how the base pools is unknown, so training
    refuses it in one line naming the file (unless both poolers are set) instead of taking mean pooling as the
    base's; ``evaluate_sts.py --model_type transformers`` says the same."""
    from ifcl.sts.encoders import load_encoder

    base = sentence_transformer_base(tiny_encoder_dir, "cls", tmp_path / "cls")
    (base / "1_Pooling" / "config.json").unlink()
    for load in (
        lambda: IFCLModel.from_encoder(str(base), queue_size=0),
        lambda: load_encoder(str(base), model_type="transformers"),
    ):
        with pytest.raises(ValueError, match=r"1_Pooling/config.json is missing") as refused:
            load()
        assert "\n" not in str(refused.value)
    both = {"pooler_type": "cls_before_pooler", "eval_pooler_type": "cls_before_pooler"}
    assert IFCLModel.from_encoder(str(base), queue_size=0, **both).config.pooler_type == "cls_before_pooler"


def test_evaluate_sts_reads_a_last_token_base_as_training_does(tmp_path):
    """One reader of a Pooling module: ``evaluate_sts.py --model_type transformers`` on a base that pools by its
    last token pools by its last token, as training takes it, not by mean."""
    from conftest import build_tiny_decoder

    from ifcl.pooling import BaseFolder, choose_poolers
    from ifcl.sts.encoders import load_encoder

    base = sentence_transformer_base(build_tiny_decoder("qwen3", tmp_path / "qwen3"), "lasttoken", tmp_path / "base")
    assert load_encoder(str(base), model_type="transformers").pooler_type == "last"
    assert choose_poolers(BaseFolder.read(str(base)), {})[0]["eval_pooler_type"] == "last"
