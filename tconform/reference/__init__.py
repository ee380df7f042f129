"""The reference Transformer in PyTorch, one module per concept.

Every forward pass is written from the formulas in the source documents; options where the
documents disagree come from `tconform.config.ModelConfig`. There is no dropout: tconform checks
inference.
"""

from tconform.reference.attention import ScaledDotProductAttention
from tconform.reference.embedding import TokenEmbedding
from tconform.reference.feed_forward import FeedForward
from tconform.reference.head import OutputHead
from tconform.reference.layers import DecoderLayer, EncoderLayer
from tconform.reference.multi_head import MultiHeadAttention, SelfAttention
from tconform.reference.norm import Norm
from tconform.reference.positional import PositionalEncoding
from tconform.reference.stacks import Decoder, Encoder
from tconform.reference.transformer import Transformer

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "Norm",
    "OutputHead",
    "PositionalEncoding",
    "ScaledDotProductAttention",
    "SelfAttention",
    "TokenEmbedding",
    "Transformer",
]
