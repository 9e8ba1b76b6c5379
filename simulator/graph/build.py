"""Build the real transformers module from an HF config on the meta device (no weights, no hub, no remote code)."""
from __future__ import annotations

import copy

from ..errors import AisimError
from ..units import TORCH_DTYPE_NAMES

# Config keys that hold a layer count, per model_type (others use num_hidden_layers through HF's attribute_map).
LAYER_KEYS = {"whisper": ("encoder_layers", "decoder_layers")}
NON_CONFIG_KEYS = ("_aisim_notes", "_aisim_defaults")


def layer_keys(config: dict) -> tuple[str, ...]:
    return LAYER_KEYS.get(config.get("model_type", ""), ("num_hidden_layers",))


def layer_count(config: dict) -> int:
    hf = make_config(config)
    counts = {getattr(hf, k) for k in layer_keys(config)}
    if len(counts) != 1:
        raise AisimError(f"layer stacks of unequal depth {sorted(counts)} are not supported yet")
    return counts.pop()


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def make_config(config: dict, layers: int | None = None):
    """An HF PretrainedConfig from a config.json dict, optionally with every layer stack cut to ``layers``."""
    from transformers import AutoConfig

    data = {k: v for k, v in copy.deepcopy(config).items() if k not in NON_CONFIG_KEYS}
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise AisimError("the config has no 'model_type'; give an HF config.json")
    if data.pop("auto_map", None):  # aisim.catalog refuses these configs; never reach custom code from here
        raise AisimError("the config asks for custom code (auto_map); aisim never runs code from a config")
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        import difflib

        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
        raise AisimError(f"transformers {_transformers_version()} does not know model_type {model_type!r}"
                         + (f" (did you mean {', '.join(close)}?)" if close else "")
                         + "; set model_type to a built-in architecture (e.g. llama, mistral, qwen2)")
    try:
        hf = AutoConfig.for_model(model_type, **data)
    except ValueError as exc:   # the architecture's own config check (a value it refuses)
        raise AisimError(f"the {model_type} config is refused by transformers: {str(exc).splitlines()[0][:300]}"
                         ) from None
    if layers is not None:
        for key in layer_keys(config):
            setattr(hf, key, layers)
    return hf


def model_class(config: dict):
    """The transformers class for a config: its ``architectures`` entry when transformers has it, else the class
    transformers' Auto classes map its ``model_type`` to (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, or the speech/text
    seq2seq mappings for encoder-decoder models), so a config with or without ``architectures`` builds the same
    model. Never remote code."""
    import transformers
    from transformers.models.auto import modeling_auto as auto

    for arch in config.get("architectures") or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    model_type = config.get("model_type")
    mappings = ((auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES, auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
                if config.get("is_encoder_decoder") else (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,))
    for mapping in mappings:
        cls = getattr(transformers, mapping.get(model_type, ""), None)
        if cls is not None:
            return cls
    raise AisimError(f"transformers has no {'sequence-to-sequence' if config.get('is_encoder_decoder') else 'causal'}"
                     f" LM class for model_type {model_type!r}; give a config of a text-generation model")


def build_meta_model(config: dict, dtype: str, layers: int | None = None, attn_impl: str = "auto"):
    """The HF model on the meta device, in eval mode, with SDPA attention where the class supports it (unless
    ``attn_impl`` asks for the explicit eager attention)."""
    import torch

    hf = make_config(config, layers)
    cls = model_class(config)
    attn = "sdpa" if getattr(cls, "_supports_sdpa", False) and attn_impl != "eager" else "eager"
    hf._attn_implementation = attn
    torch_dtype = getattr(torch, TORCH_DTYPE_NAMES[dtype])
    with torch.device("meta"):
        if hasattr(cls, "from_config"):
            model = cls.from_config(hf, dtype=torch_dtype)
        else:
            model = cls._from_config(hf, dtype=torch_dtype)
    model.eval()
    return model, attn
