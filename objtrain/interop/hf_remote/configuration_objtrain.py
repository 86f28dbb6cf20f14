"""Configuration of objtrain's encoder-decoder, as written by `objtrain export` (loaded with
`trust_remote_code=True`)."""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import PretrainedConfig


class ObjtrainEncDecConfig(PretrainedConfig):
    """Pre-norm RMSNorm blocks, interleaved RoPE in self-attention (none in cross-attention), SwiGLU, one
    embedding shared by encoder input, decoder input and the output head; no biases."""

    model_type = "objtrain_encdec"
    # what generation utilities look for
    attribute_map: ClassVar[dict[str, str]] = {"num_hidden_layers": "num_decoder_layers"}

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 512,
        intermediate_size: int = 1408,
        num_attention_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        pad_token_id: int = 0,
        bos_token_id: int = 2,
        eos_token_id: int = 3,
        decoder_start_token_id: int = 0,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        kwargs.setdefault("is_encoder_decoder", True)
        kwargs.setdefault("tie_word_embeddings", False)  # the head reads the embedding itself
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=decoder_start_token_id,
            **kwargs,
        )
