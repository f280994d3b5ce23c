"""Hugging Face interop: a local HF folder (``config.json`` + ``*.safetensors``) as model args and
weights, and the trained model back as such a folder.

  * :mod:`.folder`: the folder as published checkpoints and transformers write it: ``config.json``
    (which family, :func:`~.folder.read_config`), the safetensors files or their index, tensors read
    by boxes (``get_slice``), dequantized when the checkpoint is MXFP4 or FP8 (:mod:`.quant`).
  * :mod:`.args`: model args from the folder (``--checkpoint.initial_load_hf=DIR`` alone picks the
    family and the sizes) and the check that a flavor or overrides agree with it.
  * :mod:`.load`: the import: every rank reads only the boxes of the tensors it holds (FSDP, TP, EP
    shards).
  * :mod:`.export`: the trained model, its config and tokenizer as a folder that transformers loads.

Names, layouts and config keys go through the family's state-dict adapter
(``ModelSpec.state_dict_adapter``; contract in ``torchtitan_lite/protocols/state_dict_adapter.py``).
"""
