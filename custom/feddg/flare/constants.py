"""Names that travel over the wire between the server and the sites."""


class FedDGTask:
    """The tasks every method has; a method's own tasks are named in its folder (``feddg.flare.<method>``)."""

    TRAIN = "train"  # global weights in, local weights + metadata out (training sites only)
    EVALUATE = "evaluate"  # a model in, metric summaries out (every site, the unseen one included)
    SITE_INFO = "site_info"  # at job start: nothing in, the site's feddg version and preprocessing hash out


class FedDGMeta:
    """Keys of the training result's metadata (DXO meta / FLModel.meta)."""

    NUM_TRAIN_SAMPLES = "num_train_samples"  # N_k, training slices at the site: the FedAvg weight
    VAL_DICE = "val_dice"  # mean validation Dice of the *received* global model
    VAL_LOSS = "val_loss"  # validation Dice loss of the received global model
    TRAIN_LOSS = "train_loss"  # mean local training loss of this round
    GENERALIZATION_GAP = "generalization_gap"  # GA: val loss of the received global model minus that of the
    # site's own model from the end of the previous round (only when the job asks for it)
    MODEL_NAME = "model_name"  # on evaluate tasks: "final" or "best"
    ROUND = "model_round"  # on evaluate tasks: the round that produced the model


CONFIG_FILE = "feddg.yaml"
