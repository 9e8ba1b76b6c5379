import os
import tempfile

import pytest

# Every test run traces into its own graph cache, so no test depends on an earlier run's files.
os.environ.setdefault("AISIM_CACHE_DIR", tempfile.mkdtemp(prefix="aisim-test-cache-"))


@pytest.fixture
def tiny_llama():
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "max_position_embeddings": 512, "tie_word_embeddings": False}
