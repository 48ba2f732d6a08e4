"""The ``mla`` section of feddg.yaml: MLA (MLA-BIN, section 2.2), the feature bank after training, the domain
attention module (DAM) and the attention-weighted combination of the sites' local models. The BIN-Net half of
MLA-BIN is ``model.bin_levels``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from feddg.config import FedDGConfig, NonNegativeInt, PositiveFloat, PositiveInt, Settings

if TYPE_CHECKING:
    from feddg.methods.mla.encoders import RandomEncoder


class MLASettings(Settings):
    """Only MLA jobs read this section."""

    encoder: Literal["random", "global"] = Field("random", description=(
        "the shared feature encoder of Eq. (2): random (a CNN drawn from encoder_seed, rebuilt at every site from "
        "the seed alone) or global (the final global model's encoder)"))
    encoder_seed: NonNegativeInt = Field(0, description="seed of the random encoder")
    encoder_width: PositiveInt = Field(32, description="random encoder: channels of its first stage, doubled per "
                                                       "stage")
    encoder_depth: PositiveInt = Field(3, description=(
        "random encoder: stages; its features = encoder_width * 2 ** (encoder_depth - 1)"))
    feature_images: PositiveInt | None = Field(None, description=(
        "training images per site mapped to feature vectors (a seeded random subset); null: all of them"))
    attention_epochs: PositiveInt = Field(100, description="DAM training epochs (section 3.2: 100)")
    attention_lr: PositiveFloat = Field(1e-3, description="DAM learning rate (section 3.2: 1e-3)")
    attention_batch_size: PositiveInt = Field(8, description="DAM batch size (section 3.2: 8)")
    attention_seed: NonNegativeInt = Field(0, description="the DAM's initialization and shuffling")
    attention_conv_channels: PositiveInt = Field(128, description="convolution width of the DAM (the paper gives "
                                                                  "none)")
    attention_hidden: PositiveInt = Field(64, description="hidden width of the DAM (the paper gives none)")
    attention_mode: Literal["mean", "per_image"] = Field("mean", description=(
        "mean: one combined model per site from the mean per-image softmax; per_image: one combined model per "
        "image"))
    features_timeout: PositiveInt = Field(600, description="seconds the feature task waits for the sites")
    eval_timeout: PositiveInt = Field(3600, description="seconds the evaluation of the MLA model waits for the sites")


def mla_feature_width(cfg: FedDGConfig) -> int:
    """The width of MLA's feature vectors (Eq. 2): the random encoder's last stage, or the deepest encoder level
    of the network for the global model's encoder."""
    if cfg.mla.encoder == "global":
        return int(cfg.model.features[4])
    return int(cfg.mla.encoder_width * 2 ** (cfg.mla.encoder_depth - 1))


def random_feature_encoder(cfg: FedDGConfig) -> RandomEncoder:
    """The random encoder of Eq. (2) that ``mla.encoder_seed``, ``encoder_width`` and ``encoder_depth`` draw (the
    server's and the scripts'; each site rebuilds the same one from the feature request's fields)."""
    from feddg.methods.mla.encoders import build_feature_encoder  # torch: the job's parts read this module without it

    m = cfg.mla
    return build_feature_encoder(cfg.data.in_channels, m.encoder_seed, width=m.encoder_width, depth=m.encoder_depth)
