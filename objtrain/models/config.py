"""`ModelConfig`: the one dataclass every model kind is built from. A module of its own so imports run one
way: the zoo and the three model kinds import it; it imports none of them."""

from __future__ import annotations

from dataclasses import dataclass

from objtrain.batch import MODEL_KINDS, ModelKind
from objtrain.models.attention import ATTENTION_KERNELS


@dataclass
class ModelConfig:
    kind: ModelKind = "decoder"
    vocab_size: int = 0  # 0 = take it from the tokenizer/store at build time
    d_model: int = 256  # residual width D
    n_layer: int = 4  # decoder-only / encoder layers (encdec: encoder side)
    n_decoder_layer: int = 0  # encdec decoder layers; 0 = same as n_layer
    n_head: int = 4  # head width D / n_head must be even (rotary pairs)
    n_kv_head: int = 0  # decoder: key/value heads, each shared by n_head / n_kv_head query heads; 0 = n_head
    d_ff: int = 0  # SwiGLU hidden width; 0 = 8/3 * D rounded up to a multiple of 64 (Llama)
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    dropout: float = 0.0
    init_std: float = 0.02
    mtp_heads: int = 1  # decoder: n future-token heads (1 = plain next-token model); head 1 is the last layer
    n_segments: int = 0  # encoder: segment (sentence A/B) embeddings; 0 = none
    n_classes: int = 0  # encoder: pooled classification head outputs (2 for NSP/SOP); 0 = no head
    tie_embeddings: bool = True  # decoder: the unembedding is the token embedding; false = its own matrix
    # how masked attention runs (packed rows, padding, prefix-LM): auto = FlexAttention block masks on CUDA,
    # SDPA with a dense mask elsewhere; sdpa / flex force one (flex cannot train on CPU). Not a property of
    # the weights: the same function either way, so checkpoints do not record it.
    attention_kernel: str = "auto"

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {', '.join(MODEL_KINDS)}, got {self.kind!r}")
        if min(self.d_model, self.n_layer, self.n_head, self.mtp_heads) < 1:  # before dividing by n_head
            raise ValueError("d_model, n_layer, n_head and mtp_heads must be positive")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(f"d_model {self.d_model} must split into {self.n_head} heads of even width")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(
                f"attention_kernel must be one of {', '.join(ATTENTION_KERNELS)}, "
                f"got {self.attention_kernel!r}"
            )
        if self.mtp_heads > 1 and self.kind != "decoder":
            raise ValueError("mtp_heads > 1 needs a decoder model")
        if (self.n_segments or self.n_classes) and self.kind != "encoder":
            raise ValueError("n_segments and n_classes are for encoder models")
        if self.n_kv_head < 0 or self.n_head % self.kv_heads:
            raise ValueError(f"n_kv_head {self.n_kv_head} must divide n_head {self.n_head}")
        # the encoder's and encoder-decoder's exports and caches assume one key/value head per query head
        if (self.kv_heads != self.n_head or not self.tie_embeddings) and self.kind != "decoder":
            raise ValueError("n_kv_head and tie_embeddings=false are for decoder models")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        return -(-(8 * self.d_model // 3) // 64) * 64

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layer or self.n_layer
