"""The float64 oracle: one plain NumPy function per component, independent of torch.

Goldens come from here, not from PyTorch: PyTorch is one more implementation under test. Each
function takes the parameters as a mapping from the reference module's parameter names to
float64 arrays (`Params`), the config, and the component's inputs.
"""

from tconform.oracle.attention import scaled_dot_product_attention, softmax
from tconform.oracle.embedding import token_embedding
from tconform.oracle.feed_forward import feed_forward
from tconform.oracle.head import output_head
from tconform.oracle.layers import decoder_layer, encoder_layer
from tconform.oracle.multi_head import multi_head_attention
from tconform.oracle.norm import norm
from tconform.oracle.params import Params, scope
from tconform.oracle.positional import positional_encoding, sinusoid_table
from tconform.oracle.stacks import decoder, encoder
from tconform.oracle.transformer import transformer

__all__ = [
    "Params",
    "decoder",
    "decoder_layer",
    "encoder",
    "encoder_layer",
    "feed_forward",
    "multi_head_attention",
    "norm",
    "output_head",
    "positional_encoding",
    "scaled_dot_product_attention",
    "scope",
    "sinusoid_table",
    "softmax",
    "token_embedding",
    "transformer",
]
