"""objtrain's sentencepiece tokenizer as Hugging Face tokenizer files (`AutoTokenizer` loads them).

transformers' generic converter (`TokenizersBackend` reading `tokenizer.model`) follows the model's own
settings: identity normalisation, no dummy prefix, no whitespace folding, byte fallback. So encoding
equals sentencepiece's and decoding is exact, but for three cases the `tokenizers` library cannot copy:
a reserved piece spelled literally in the text (`<mask>`) is matched as that token where sentencepiece
never matches a control piece; text holding `▁` decodes to a space; and a unigram lattice tie may be
broken the other way (decoding is still exact). Training data should be tokenized by objtrain.

The `LlamaTokenizer` class is deliberately not named: in transformers 5 it forces a BPE model and a
dummy-prefix space, which changes the ids of a unigram model and loses a leading space on decode.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.extras import require
from objtrain.specials import FIXED_PIECES

NAMED = ("pad", "unk", "bos", "eos", "mask", "cls", "sep")  # transformers' own special-token slots


def tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    pieces = dict(FIXED_PIECES)
    named = {f"{name}_token": pieces[name] for name in NAMED}
    extra = [piece for name, piece in FIXED_PIECES if name not in NAMED]
    extra += tokenizer.specials.reserved_pieces()[len(FIXED_PIECES) :]  # sentinels, at their fixed ids
    return {
        "tokenizer_class": "TokenizersBackend",
        **named,
        "additional_special_tokens": extra,
        # objtrain adds no BOS/EOS inside a document; EOS closes each one in packed rows
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
    }


def save_hf_tokenizer(tokenizer: Tokenizer, directory: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and tokenizer.model."""
    require("google.protobuf", "converting the sentencepiece tokenizer")
    transformers = require("transformers", "objtrain export")
    directory = Path(directory)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.model").write_bytes(tokenizer.model_proto)
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer)))
        hf = transformers.AutoTokenizer.from_pretrained(tmp)
    ids = hf.convert_tokens_to_ids(tokenizer.specials.reserved_pieces())
    if ids != list(range(len(ids))) or len(hf) != tokenizer.vocab_size:
        raise UserError(
            f"the converted tokenizer puts objtrain's special tokens at other ids ({len(hf)} tokens, "
            f"expected {tokenizer.vocab_size}); this transformers version is not supported for export"
        )
    hf.save_pretrained(str(directory))
    (directory / "tokenizer.model").write_bytes(tokenizer.model_proto)
