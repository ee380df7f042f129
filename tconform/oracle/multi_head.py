import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.attention import scaled_dot_product_attention
from tconform.oracle.params import Params, linear, scope


def multi_head_attention(
    params: Params,
    cfg: ModelConfig,
    query: np.ndarray,
    key_value: np.ndarray,
    key_keep: np.ndarray,
    causal: bool = False,
) -> np.ndarray:
    """Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Head i uses rows i*d_head..(i+1)*d_head of each projection; key_keep (B, S_kv) is False at
    padding; causal hides positions after the query's own.
    """
    q_all = linear(scope(params, "w_q"), query)
    k_all = linear(scope(params, "w_k"), key_value)
    v_all = linear(scope(params, "w_v"), key_value)
    mask = key_keep[:, None, :]  # (B, 1, S_kv)
    if causal:
        s_q, s_kv = query.shape[1], key_value.shape[1]
        mask = mask & (np.arange(s_kv)[None, :] <= np.arange(s_q)[:, None])
    heads = []
    for i in range(cfg.n_heads):
        cols = slice(i * cfg.d_head, (i + 1) * cfg.d_head)
        head, _ = scaled_dot_product_attention(
            q_all[..., cols], k_all[..., cols], v_all[..., cols], mask, cfg.fill_value
        )
        heads.append(head)
    return linear(scope(params, "w_o"), np.concatenate(heads, axis=-1))
