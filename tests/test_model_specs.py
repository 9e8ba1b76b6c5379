"""Every shipped model config builds in transformers (on the meta device) with the published parameter count.

The published figure for each file is listed here with its source; the check is the parameter count of the model
built from the config, within 2%. Models with no published count (the CS336 assignment models and the AICrossSim
CLMs, whose names are rounded) are checked against the closed-form Llama count instead, which catches a wrong
shape field (heads, kv heads, ffn width, vocab, tying) just as well.
"""
from __future__ import annotations

import json
import warnings
from importlib import resources
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL_DIR = Path(str(resources.files("aisim.model_specs")))
FILES = sorted(MODEL_DIR.glob("*.json"))

HF = "Hugging Face hub model page (safetensors parameter count)"

# stem -> (published parameter count, source). Checked within TOLERANCE.
PUBLISHED: dict[str, tuple[float, str]] = {
    "opt-125m": (125e6, "OPT paper (Zhang et al. 2022, arXiv:2205.01068) Table 1: 125M"),
    "opt-350m": (331e6, f"{HF} facebook/opt-350m: 331M (the paper's '350M' is rounded)"),
    "opt-1.3b": (1.3e9, "OPT paper Table 1: 1.3B"),
    "opt-2.7b": (2.7e9, "OPT paper Table 1: 2.7B"),
    "opt-6.7b": (6.7e9, "OPT paper Table 1: 6.7B"),
    "opt-13b": (13e9, "OPT paper Table 1: 13B"),
    "opt-30b": (30e9, "OPT paper Table 1: 30B"),
    "opt-66b": (66e9, "OPT paper Table 1: 66B"),
    "bloom-560m": (559_214_592, "bigscience/bloom-560m model card: 559,214,592 parameters"),
    "bloom-1b1": (1_065_314_304, "bigscience/bloom-1b1 model card: 1,065,314,304 parameters"),
    "bloom-1b7": (1_722_408_960, "bigscience/bloom-1b7 model card: 1,722,408,960 parameters"),
    "bloom-3b": (3_002_557_440, "bigscience/bloom-3b model card: 3,002,557,440 parameters"),
    "bloom-7b1": (7_069_016_064, "bigscience/bloom-7b1 model card: 7,069,016,064 parameters"),
    "bloomz-7b1-mt": (7_069_016_064, "bigscience/bloomz-7b1-mt model card (same architecture as bloom-7b1)"),
    "gpt2": (124e6, "openai-community/gpt2 model card: 124M parameters"),
    "gpt2-medium": (355e6, "openai-community/gpt2-medium model card: 355M parameters"),
    "gpt2-large": (774e6, "openai-community/gpt2-large model card: 774M parameters"),
    "gpt2-xl": (1542e6, "GPT-2 paper (Radford et al. 2019) Table 2: 1542M"),
    "Llama-2-7b-hf": (6.74e9, f"{HF} meta-llama/Llama-2-7b-hf: 6.74B"),
    "Llama-2-13b-hf": (13.0e9, "Llama 2 paper (Touvron et al. 2023, arXiv:2307.09288) Table 1: 13B"),
    "Llama-2-70b-hf": (69.0e9, f"{HF} meta-llama/Llama-2-70b-hf: 69B"),
    "Meta-Llama-3-8B": (8.03e9, f"{HF} meta-llama/Meta-Llama-3-8B: 8.03B"),
    "Meta-Llama-3-70B": (70.6e9, f"{HF} meta-llama/Meta-Llama-3-70B: 70.6B"),
    "Mistral-7B-v0.1": (7.3e9, "Mistral AI announcement 'Mistral 7B' (Sept 2023): a 7.3B parameter model"),
    "Mixtral-8x7B-v0.1": (46.7e9, "Mistral AI announcement 'Mixtral of experts' (Dec 2023): 46.7B total parameters"),
    "Qwen2.5-7B": (7.61e9, "Qwen/Qwen2.5-7B model card: Number of Parameters 7.61B"),
    "OLMoE-1B-7B-0924": (6.9e9, "OLMoE paper (Muennighoff et al. 2024, arXiv:2409.02060): 6.9B total, 1.3B active"),
    "Qwen1.5-MoE-A2.7B": (14.3e9, "Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B parameters in total, 2.7B activated"),
    "Qwen3-30B-A3B": (30.5e9, "Qwen/Qwen3-30B-A3B model card: 30.5B in total and 3.3B activated"),
    "gpt-oss-20b": (21e9, "OpenAI gpt-oss-120b & gpt-oss-20b model card (2025-08-05): 21B total, 3.6B active parameters"),
    "DeepSeek-V3": (671e9, "DeepSeek-V3 technical report (arXiv:2412.19437): 671B total parameters, 37B activated"),
    "DeepSeek-V2-Lite": (15.7e9, "deepseek-ai/DeepSeek-V2-Lite model card: 15.7B total parameters, 2.4B activated"),
    "whisper-tiny": (37.8e6, f"{HF} openai/whisper-tiny: 37.8M (the paper's 39M counts differently)"),
    "whisper-base": (72.6e6, f"{HF} openai/whisper-base: 72.6M"),
    "whisper-small": (244e6, "Whisper paper (Radford et al. 2022, arXiv:2212.04356) Table 1: small 244M"),
    "whisper-medium": (769e6, "Whisper paper Table 1: medium 769M"),
    "whisper-medium.en": (769e6, "Whisper paper Table 1: medium 769M (English-only variant, one fewer vocab row)"),
    "whisper-large-v3": (1550e6, "Whisper paper Table 1: large 1550M (large-v3 adds 128 mel bins, 1 vocab row)"),
}

# Models with no published exact count: checked against the closed-form count of an untied Llama.
ANALYTIC = {
    "clm-60m", "clm-200m", "clm-400m", "clm-1.1b",  # AICrossSim names are rounded, not counts
    "cs336-small", "cs336-medium", "cs336-large", "cs336-xl", "cs336-2.7b",  # course models, not on the hub
}
TOLERANCE = 0.02


def _load(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _llama_count(cfg: dict) -> int:
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // heads
    vocab = cfg["vocab_size"]
    attn = d * heads * hd + 2 * d * kv * hd + heads * hd * d
    mlp = 3 * d * ff
    per_layer = attn + mlp + 2 * d  # two RMSNorm weights
    embed = vocab * d * (1 if cfg.get("tie_word_embeddings") else 2)
    return embed + layers * per_layer + d  # final norm


def _build(cfg: dict):
    from transformers import AutoConfig, AutoModelForCausalLM, WhisperForConditionalGeneration

    kwargs = {k: v for k, v in cfg.items() if not k.startswith("_")}
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, **kwargs)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        if model_type == "whisper":
            return WhisperForConditionalGeneration(config)
        return AutoModelForCausalLM.from_config(config)


def test_every_file_is_listed():
    stems = {p.stem for p in FILES}
    assert stems, "no model spec files found"
    listed = set(PUBLISHED) | ANALYTIC
    assert stems == listed, f"unlisted: {sorted(stems - listed)}; missing files: {sorted(listed - stems)}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_config_keys(path: Path):
    cfg = _load(path)
    for key in ("_name_or_path", "architectures", "model_type", "torch_dtype"):
        assert key in cfg, f"{path.name}: no {key}"
    assert cfg["_name_or_path"].split("/")[-1] == path.stem
    assert "/" in cfg["_name_or_path"], "give the organisation too"
    assert cfg["torch_dtype"] in {"float32", "float16", "bfloat16"}
    extra = [k for k in cfg if k.startswith("_") and k not in ("_name_or_path", "_aisim_notes",
                                                                 "_remove_final_layer_norm")]
    assert not extra, f"unexpected private keys {extra}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_parameter_count(path: Path):
    cfg = _load(path)
    model = _build(cfg)
    assert type(model).__name__ == cfg["architectures"][0]
    n = sum(p.numel() for p in model.parameters())
    if path.stem in ANALYTIC:
        expected, source = _llama_count(cfg), "closed-form Llama count"
        assert n == expected, f"{path.stem}: built {n:,} parameters, {source} gives {expected:,}"
    else:
        expected, source = PUBLISHED[path.stem]
        assert abs(n - expected) <= TOLERANCE * expected, (
            f"{path.stem}: built {n:,} parameters, published {expected:,.0f} ({source})")
