"""Small real models for `tconform check` (issue 21): each factory returns
`(module, example_inputs)` as `tconform check PACKAGE.MODULE:FACTORY` expects them.

Every model is built from a config with random weights (nothing is downloaded), under a fixed
seed, so two calls of a factory give the same module and inputs. Sizes are "real but tiny":
2 layers, hidden 32, 4 heads, vocabulary 256, sequences of 12, batches of 2, so that each
exports in seconds on a 2-core machine.

After construction every floating-point parameter is nudged with seeded noise, as training
would move it (and the ResNet's batch-norm statistics are set away from 0 and 1): fresh-init
values (LayerNorm gain 1, bias 0, zero biases) would hide a fault in a gain or a bias, and
identical layers would let a wrong pairing of boundaries pass unnoticed (`gpt_neox` keeps its
norms' initial values on purpose: see there).

What the zoo covers, for the tool:
- keyword inputs (a dict): `bert`, `bart`, `t5`, `torch_encoder`, `llama_left_padded`;
  positional inputs (a tuple): `gpt2`, `llama`, `gpt_neox`, `vit`, `resnet`, `inplace_mlp`;
- an output that is a transformers `ModelOutput` (a dict) left unwrapped: `bert`
  (last_hidden_state and pooler_output); the others return one tensor (logits or features);
- padding: `bert` and `torch_encoder` right-padded, `llama_left_padded` left-padded;
- a parallel residual whose two norms the exporter merges into one node: `gpt_neox`;
- vision code habits: `resnet` (in-place ReLU, BatchNorm with running statistics, one ReLU
  instance called twice, a `+=` residual) and the smallest in-place case, `inplace_mlp`.

`attn_implementation="eager"` is set on every transformers config (each transformers factory
takes `attn_implementation=` to try another), because transformers 5's default, "sdpa",
breaks two of the zoo's cases before they reach what they are there to test
(docs/zoo-findings.md):
- the dynamo export of T5 with sdpa fails inside torch ("Cannot view a tensor ... as a tensor
  with shape (2, 12, 32)", in the decomposition step);
- with sdpa, ONNX Runtime and PyTorch disagree at the padded (fully masked) query positions of
  a left-padded decoder; with eager they agree everywhere.
Eager has its own catch: Llama's eager softmax runs in float32 even in the float64 reference,
so a fully masked row of the left-padded batch is NaN there (see `llama_left_padded`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

SEED = 0
BATCH, SEQ, VOCAB = 2, 12, 256
HIDDEN, HEADS, FFN, LAYERS = 32, 4, 64, 2

Inputs = tuple[torch.Tensor, ...] | dict[str, torch.Tensor]
Factory = Callable[[], tuple[nn.Module, Inputs]]


@contextlib.contextmanager
def _seeded(seed: int = SEED) -> Iterator[None]:
    """Construction and inputs under a fixed seed, without touching the caller's RNG state."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def _nudge(module: nn.Module, scale: float = 0.02) -> nn.Module:
    """Move every floating-point parameter a little, as training would (see the docstring)."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.is_floating_point():
                parameter.add_(scale * torch.randn_like(parameter))
    return module.eval()


def _tokens(batch: int = BATCH, seq: int = SEQ, low: int = 3) -> torch.Tensor:
    """Token ids above the special ids (0, 1, 2: pad, bos, eos in most configs)."""
    return torch.randint(low, VOCAB, (batch, seq))


def _right_padding(real: int, batch: int = BATCH, seq: int = SEQ) -> torch.Tensor:
    """An attention mask (1 = attend) whose last sequence has `real` tokens, then padding."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, real:] = 0
    return mask


# --- wrappers: a transformers model returning one tensor -------------------------------------


class CausalLMLogits(nn.Module):
    """A decoder-only LM returning its logits, without a key/value cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        return out.logits


class Seq2SeqLogits(nn.Module):
    """An encoder-decoder LM returning its logits, teacher-forced, without a cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        )
        return out.logits


class ImageLogits(nn.Module):
    """An image classifier returning its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


# --- transformers, from configs ----------------------------------------------------------------


def bert(attn_implementation: str = "eager") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """BertModel (with its pooler), unwrapped: returns a ModelOutput with last_hidden_state and
    pooler_output; keyword inputs with a right-padded attention mask."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=64,
        type_vocab_size=2,
        attn_implementation=attn_implementation,
    )
    with _seeded():
        model = _nudge(BertModel(config))
        input_ids = _tokens()
        token_type_ids = torch.zeros_like(input_ids)
        token_type_ids[:, SEQ // 2 :] = 1
    attention_mask = _right_padding(real=8)
    input_ids[attention_mask == 0] = config.pad_token_id
    return model, {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }


def gpt2(attn_implementation: str = "eager") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPT2LMHeadModel returning logits; one positional input (token ids)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=FFN,
        bos_token_id=1,  # GPT-2's own (50256) lies outside this vocabulary
        eos_token_id=2,
        attn_implementation=attn_implementation,
    )
    with _seeded():
        model = _nudge(GPT2LMHeadModel(config))
        input_ids = _tokens()
    return CausalLMLogits(model).eval(), (input_ids,)


def bart(attn_implementation: str = "eager") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """BartForConditionalGeneration returning logits; a right-padded source."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_position_embeddings=64,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    with _seeded():
        model = _nudge(BartForConditionalGeneration(config))
        input_ids = _tokens()
        decoder_input_ids = _tokens(seq=SEQ - 4)
    attention_mask = _right_padding(real=8)
    input_ids[attention_mask == 0] = config.pad_token_id
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    return Seq2SeqLogits(model).eval(), {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
    }


def t5(attn_implementation: str = "eager") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """T5ForConditionalGeneration (relative position buckets, T5's RMS-style LayerNorm)
    returning logits; a right-padded source."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=HIDDEN // HEADS,
        d_ff=FFN,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        decoder_start_token_id=0,
        pad_token_id=0,
        use_cache=False,
        attn_implementation=attn_implementation,
    )
    with _seeded():
        model = _nudge(T5ForConditionalGeneration(config))
        input_ids = _tokens()
        decoder_input_ids = _tokens(seq=SEQ - 4)
    attention_mask = _right_padding(real=8)
    input_ids[attention_mask == 0] = config.pad_token_id
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    return Seq2SeqLogits(model).eval(), {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
    }


def vit(attn_implementation: str = "eager") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ViTForImageClassification on 32x32 images in 8x8 patches, returning logits."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        num_labels=10,
        attn_implementation=attn_implementation,
    )
    with _seeded():
        model = _nudge(ViTForImageClassification(config))
        pixel_values = torch.randn(BATCH, 3, 32, 32)
    return ImageLogits(model).eval(), (pixel_values,)


def _llama_config(attn_implementation: str):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,  # grouped-query attention, as current models have
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=0,
        attn_implementation=attn_implementation,
    )


def _llama(attn_implementation: str) -> nn.Module:
    from transformers import LlamaForCausalLM

    return _nudge(LlamaForCausalLM(_llama_config(attn_implementation)))


def llama(attn_implementation: str = "eager") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A Llama-style decoder (rotary embeddings, RMSNorm, SwiGLU MLP, grouped-query attention)
    returning logits; one positional input (token ids), no padding."""
    with _seeded():
        model = _llama(attn_implementation)
        input_ids = _tokens()
    return CausalLMLogits(model).eval(), (input_ids,)


def llama_left_padded(
    attn_implementation: str = "eager",
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The Llama-style decoder on a LEFT-padded batch, as batched generation feeds it: the
    second sequence starts with 4 pad tokens, its attention mask is 0 there, and its position
    ids count from its first real token (what `generate` computes from the mask).

    At the padded query positions every key is masked. In float32 (PyTorch, ONNX Runtime) the
    row's softmax is uniform; in the float64 reference the mask is float64's minimum, which the
    eager softmax (computed in float32) turns into -inf, so the row is NaN, and the NaN spreads
    to the whole second sequence in the next layer: `check` fails this model on every runtime
    (docs/zoo-findings.md, R7)."""
    with _seeded():
        model = _llama(attn_implementation)
        input_ids = _tokens()
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[-1, :4] = 0
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return CausalLMLogits(model).eval(), {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }


def gpt_neox(attn_implementation: str = "eager") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPTNeoXForCausalLM (parallel residual: attention and MLP both read the layer's input,
    each through its own LayerNorm; partial rotary embeddings) returning logits.

    Every parameter is nudged except the LayerNorms', which keep their initial 1 and 0 as a
    model fresh from its config has them: each layer's two norms then compute the same
    function of the same tensor, and the exporter computes it once, under one norm's scope
    (the other has no node of its own). A value that several modules read, beside a module
    without nodes, is what localisation must not pair with that module's outputs."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=64,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation=attn_implementation,
    )
    with _seeded():
        model = GPTNeoXForCausalLM(config)
        norms = {p for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter not in norms:
                    parameter.add_(0.02 * torch.randn_like(parameter))
        input_ids = _tokens()
    return CausalLMLogits(model.eval()).eval(), (input_ids,)


# --- PyTorch's own encoder ---------------------------------------------------------------------


def torch_encoder() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """nn.TransformerEncoder (2 post-norm layers, GELU, a final LayerNorm) with a key-padding
    mask. `enable_nested_tensor=False`: otherwise the encoder packs the padded batch into a
    nested tensor and writes 0 at padded positions, which no exported graph reproduces. The
    mask means True = ignore this position (nn.MultiheadAttention's convention)."""
    with _seeded():
        layer = nn.TransformerEncoderLayer(
            HIDDEN, HEADS, FFN, dropout=0.1, activation="gelu", batch_first=True
        )
        encoder = nn.TransformerEncoder(
            layer, LAYERS, norm=nn.LayerNorm(HIDDEN), enable_nested_tensor=False
        )
        # The encoder deep-copies one layer: nudging makes each layer its own.
        _nudge(encoder, 0.05)
        src = torch.randn(BATCH, SEQ, HIDDEN)
    padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    padding[-1, 8:] = True
    return encoder.eval(), {"src": src, "src_key_padding_mask": padding}


# --- a CNN written the way vision code is written ----------------------------------------------


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, as it is written there: one ReLU(inplace=True)
    instance called twice, a `+=` residual."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class SmallResNet(nn.Module):
    """A stem, two stages of one BasicBlock each, global average pooling, a classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(16, 16))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """SmallResNet on 2 images of 3x16x16, with batch-norm statistics that are not the fresh
    (0, 1): eval mode (running statistics) and train mode (batch statistics) differ."""
    with _seeded():
        model = SmallResNet()
        _nudge(model, 0.05)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn_like(m.running_mean))
                m.running_var.copy_(torch.empty_like(m.running_var).uniform_(0.5, 1.5))
                m.num_batches_tracked.fill_(100)
        x = torch.randn(BATCH, 3, 16, 16)
    return model.eval(), (x,)


def inplace_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The smallest in-place case: Linear, ReLU(inplace=True), Linear."""
    with _seeded():
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 4))
        x = torch.randn(BATCH, 8)
    return model.eval(), (x,)


ZOO: dict[str, Factory] = {
    "bert": bert,
    "gpt2": gpt2,
    "bart": bart,
    "t5": t5,
    "vit": vit,
    "llama": llama,
    "llama_left_padded": llama_left_padded,
    "gpt_neox": gpt_neox,
    "torch_encoder": torch_encoder,
    "resnet": resnet,
    "resnet_torchscript": resnet,  # exported by TorchScript (EXPORTERS): BatchNorm folded away
    "inplace_mlp": inplace_mlp,
}

# The exporter a model is checked with, where it is not the default (`auto`: dynamo first).
EXPORTERS: dict[str, str] = {"resnet_torchscript": "torchscript"}

# Per model: modules whose weight a localisation test corrupts (tests/zoo/corrupt.py), one whose
# weight the dynamo exporter renames (a Linear, or GPT-2's Conv1D) and one whose weight keeps
# its module-path name (a norm or a convolution).
TARGETS: dict[str, tuple[str, ...]] = {
    "bert": ("encoder.layer.1.intermediate.dense", "encoder.layer.0.attention.output.LayerNorm"),
    "gpt2": ("model.transformer.h.1.mlp.c_fc", "model.transformer.h.0.ln_2"),
    "bart": (
        "model.model.decoder.layers.1.fc1",
        "model.model.encoder.layers.1.self_attn_layer_norm",
    ),
    "t5": (
        "model.encoder.block.1.layer.1.DenseReluDense.wi",
        "model.decoder.block.0.layer.0.layer_norm",
    ),
    "vit": ("model.vit.layers.1.mlp.fc1", "model.vit.embeddings.patch_embeddings.projection"),
    "llama": ("model.model.layers.1.mlp.up_proj", "model.model.layers.0.post_attention_layernorm"),
    "llama_left_padded": (
        "model.model.layers.1.mlp.up_proj",
        "model.model.layers.0.post_attention_layernorm",
    ),
    # the MLP's output projection, read after the two branches meet; the attention's, beside
    # a norm without nodes
    "gpt_neox": (
        "model.gpt_neox.layers.1.mlp.dense_4h_to_h",
        "model.gpt_neox.layers.0.attention.dense",
    ),
    "torch_encoder": ("layers.1.linear1", "layers.0.norm2"),
    "resnet": ("layer1.0.conv2", "layer2.0.bn1"),
    # TorchScript folds each BatchNorm into the Conv before it (no nodes of its own): a Conv's
    # weight, named as "conv + bn", the one unit the graph has.
    "resnet_torchscript": ("layer1.0.conv2", "layer2.0.conv1"),
    "inplace_mlp": ("2", "0"),
}
